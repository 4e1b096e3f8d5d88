"""The model stages (TargetModel, DraftModel) run at normal CPU priority.

Ray lowers its worker processes' priority (`worker_niceness`, 15) from the thread that starts
the worker, after the core worker's gRPC and I/O threads are up: those threads, which carry
every streamed chunk, stay at niceness 0, as do the proxy's and the other stages' I/O threads
and any client on the same machine. An engine step thread started by the replica inherits 15,
and the Linux scheduler gives a niceness-15 thread about 3% of a core against a niceness-0
one, so the engine stalls whenever chunk traffic lands on its core. Ray keeps its own job
supervisor at 0 the same way (`RAY_worker_niceness` in the actor's runtime_env). Measured on
2 CPU cores, alternating runs: HTTP e2e at concurrency 8 1266-1333 ms at 15, 1124-1203 ms at
0 (benchmarks/RESULTS.md). The other stages keep Ray's default: with every worker at 0 the
engine shares its core with the proxy on equal terms, and that measured worse.
"""

NORMAL_PRIORITY_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
