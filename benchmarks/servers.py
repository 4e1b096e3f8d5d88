"""Start and stop the servers the serving benchmarks compare, one at a time on one port.

- `specserve`: `serve run serve_config.yaml` from a source tree (this checkout, or another
  commit's worktree: `compare_refs.py`), with app arguments overridden in a temporary copy of
  the config (e.g. `speculative_method=null`), and the file's own keys as `serve.<dotted
  path>=...` (e.g. `serve.controller_options=null`: the Python proxy instead of HAProxy;
  `serve.controller_options.runtime_env.env_vars.NAME="value"`: one more variable). Only
  that tree is on PYTHONPATH.
- `vllm`: vLLM's OpenAI server from its own venv (see offline_throughput.py's docstring for
  the install), `python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI dies of an
  illegal instruction on these CPUs), fp32, the same checkpoint and served name.

Each server runs in a session of its own: stopping it (Ctrl-C first, as a user would, then
SIGKILL to the session) ends its whole Ray cluster and nothing else on the machine, and the
next one starts only once the port is free (a dying proxy would otherwise answer it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL_PREFIX = "serve."  # an override of a key of serve_config.yaml itself (a dotted path), not an app argument
DEFAULT_VLLM_PYTHON = os.environ.get("SPECSERVE_VLLM_PYTHON", str(Path.home() / "vllm-venv" / "bin" / "python"))


@dataclass
class ServerSpec:
    """`kind` "specserve" or "vllm"; `label` names it in tables (e.g. "specserve, no speculation")."""
    kind: str
    label: str
    source: Path = ROOT  # specserve: the tree to serve from
    overrides: dict = field(default_factory=dict)  # specserve: app arguments
    vllm_python: str = DEFAULT_VLLM_PYTHON

    @classmethod
    def parse(cls, text: str, vllm_python: str = DEFAULT_VLLM_PYTHON) -> "ServerSpec":
        """"vllm", "specserve", or "specserve:key=value,key=value" (YAML values: null, 2, ...)."""
        kind, _, rest = text.partition(":")
        if kind not in ("specserve", "vllm"):
            raise SystemExit(f"unknown server {text!r}: specserve[:key=value,...] or vllm")
        overrides = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            overrides[key] = yaml.safe_load(value)
        return cls(kind, text, overrides=overrides, vllm_python=vllm_python)


def vllm_available(python: str) -> str | None:
    """None when vLLM can run here, else why not (printed by the caller, which skips it)."""
    if not Path(python).exists():
        return f"no interpreter at {python} (offline_throughput.py's docstring says how to install it)"
    check = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if check.returncode != 0:
        return f"{python} cannot import vllm: {(check.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def _specserve_command(spec: ServerSpec, port: int, workdir: Path) -> tuple[list[str], dict, Path]:
    config = yaml.safe_load((spec.source / "serve_config.yaml").read_text())
    config.setdefault("http_options", {})["port"] = port
    for key, value in spec.overrides.items():
        if key.startswith(TOP_LEVEL_PREFIX):  # e.g. serve.controller_options=null
            _set_path(config, key[len(TOP_LEVEL_PREFIX):].split("."), value)
        else:
            config["applications"][0]["args"][key] = value
    path = workdir / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(spec.source), HF_HUB_OFFLINE="1")
    serve = Path(sys.executable).with_name("serve")  # this venv's, beside its python
    return [str(serve), "run", str(path)], env, spec.source


def _set_path(config: dict, path: list[str], value) -> None:
    """config[a][b]... = value along the dotted path (dicts made where missing; a number picks a
    list's item, as in `applications.0.deployments.0`); None removes it."""
    *parents, leaf = path
    for name in parents:
        config = config[int(name)] if isinstance(config, list) else config.setdefault(name, {})
    config.pop(leaf, None)
    if value is not None:
        config[leaf] = value


def _vllm_command(spec: ServerSpec, port: int, model: str, served_name: str) -> tuple[list[str], dict, Path]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    # --gpu-memory-utilization: without it vLLM's CPU build asks for 92% of the NUMA node's
    # memory and refuses to start on this 24 GiB machine.
    return ([spec.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--served-model-name", served_name, "--dtype", "float32", "--port", str(port),
             "--gpu-memory-utilization", "0.5"], env, ROOT)


def wait_until_serving(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no answer from {url}/v1/models within {timeout_s:.0f} s")


def session_pids(session_id: int) -> list[int]:
    """Every process of a session: Ray gives each worker a process group of its own, but they
    all stay in the session the server started."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:  # field 6 of stat: the session id
                pids.append(int(stat.parent.name))
    return pids


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def stop(process: subprocess.Popen, port: int, grace_s: float = 60) -> None:
    """Ctrl-C to the server, then SIGKILL to what is left of its session (its Ray cluster
    with it); returns once nothing answers on its port."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    for pid in session_pids(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 60
    while not port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.5)


@contextlib.contextmanager
def running(spec: ServerSpec, port: int, model: str, served_name: str, log_path: Path,
            startup_timeout_s: float = 600):
    """The server, serving at http://127.0.0.1:PORT until the block ends."""
    if not port_is_free(port):
        raise RuntimeError(f"port {port} is already taken: another server is running there")
    with tempfile.TemporaryDirectory(prefix="specserve-bench-") as tmp:
        if spec.kind == "specserve":
            cmd, env, cwd = _specserve_command(spec, port, Path(tmp))
        else:
            cmd, env, cwd = _vllm_command(spec, port, model, served_name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                wait_until_serving(f"http://127.0.0.1:{port}", process, startup_timeout_s)
                yield f"http://127.0.0.1:{port}"
            finally:
                stop(process, port)
