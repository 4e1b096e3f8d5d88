"""What the tests read about processes from Linux /proc: the Serve replicas of an app, the
engine processes they started, thread niceness, and whether a pid is still running."""

from __future__ import annotations

from pathlib import Path

REPLICA_PREFIX = "ray::ServeReplica:"
ENGINE_MODULE = b"app.engine.engine_process"


def argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # ended while we looked
        return []


def _stat_fields(pid: int, task: int | None = None) -> list[str]:
    """The fields of /proc/<pid>[/task/<tid>]/stat after the command name (field 3 onwards)."""
    path = Path(f"/proc/{pid}") / (f"task/{task}/stat" if task is not None else "stat")
    return path.read_text().rsplit(")", 1)[1].split()


def parent_pid(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except OSError:
        return None


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper in a container)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def replica_stages(app_name: str) -> dict[int, str]:
    """pid -> deployment name of every replica process of `app_name`."""
    prefix = f"{REPLICA_PREFIX}{app_name}:"
    stages = {}
    for proc in Path("/proc").glob("[0-9]*"):
        args = argv(int(proc.name))
        title = args[0].decode(errors="replace") if args else ""
        if title.startswith(prefix):  # "<prefix>TargetModel", or "<prefix>TargetModel.<method>" while it runs one
            stages[int(proc.name)] = title[len(prefix):].split()[0].split(".")[0]
    return stages


def engine_processes() -> dict[int, int | None]:
    """pid -> parent pid of every engine process (app/engine/engine_process.py) on this machine."""
    return {int(p.name): parent_pid(int(p.name)) for p in Path("/proc").glob("[0-9]*")
            if ENGINE_MODULE in argv(int(p.name))}


def thread_niceness(pid: int) -> set[int]:
    values = set()
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            values.add(int(_stat_fields(pid, int(task.name))[16]))  # stat field 19: nice
    except OSError:  # a process or thread that ended while we looked
        pass
    return values


def _listening_socket_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on `port` (IPv4 and IPv6) on this machine."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def listening_process_names(port: int) -> set[str]:
    """The names (/proc/<pid>/comm) of the processes that hold a socket listening on `port`."""
    wanted = {f"socket:[{inode}]" for inode in _listening_socket_inodes(port)}
    names = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(str(fd.readlink()) in wanted for fd in (proc / "fd").iterdir()):
                names.add((proc / "comm").read_text().strip())
        except OSError:  # ended while we looked, or not ours to read
            continue
    return names
