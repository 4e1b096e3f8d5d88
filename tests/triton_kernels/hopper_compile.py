"""Compile the GPU path's Triton kernels for an H100 (sm_90) on a machine without a GPU.

The interpreter runs the kernels' logic on the CPU but never compiles them: it checks no types
(a pointer typed bf16 in one branch and fp32 in the other ran there and failed to compile on
the H100, RESULTS.md 2026-11-26) and says nothing of registers, spills or software pipelining.
Triton's compiler and ptxas need no GPU, only a target. So each kernel wrapper is called with
the shapes of a Llama-3-8B decode step (bf16, the tuned settings the engine uses on CUDA),
every launch is caught before it reaches a driver, and the launch is compiled as Triton's JIT
would compile it there: the same constexprs, and the same specialisation of integers (1 as a
constant, multiples of 16 as divisible) and of pointers (16-byte aligned).

    python tests/triton_kernels/hopper_compile.py   # a table: registers, shared memory, spills
    python tests/triton_kernels/hopper_compile.py --dependent-launch   # as launched with PDL
    python tests/triton_kernels/hopper_compile.py --eager-variants     # compiled variants over eager shapes

Must run in a process without TRITON_INTERPRET (the interpreter replaces `triton.jit`);
`test_hopper_compile.py` starts one. The figures are this Triton's ptxas's; the H100 lent to
this project ran Triton 3.6.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
HARNESS_UNSUPPORTED = 3  # exit status: this Triton's internals differ from what the harness knows
TRITON_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                 torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "u1"}


@dataclass
class Launch:
    label: str
    kernel: JITFunction
    args: dict  # parameter name -> value, defaults applied
    options: dict  # num_warps, num_stages, launch_pdl


@dataclass
class Compiled:
    label: str
    kernel: str
    registers: int
    local_bytes: int  # spills (or local arrays): per-thread local memory
    shared_bytes: int
    async_copies: int  # cp.async instructions in the PTX: loads the pipeliner made asynchronous
    waits_first: bool  # griddepcontrol.wait (programmatic dependent launch) before any memory access
    tensor_cores: str  # the dots' instructions: "wgmma" (Hopper's warpgroup MMA), "mma" (sm_80's), or ""
    l1_loads_after_arrival: int  # global loads through L1 after the first atomic (specserve_kernels/arrival_counts.py)
    l2_prefetches: int  # cp.async.bulk.prefetch.L2 instructions (specserve_kernels/l2_prefetch.py)
    l2_evict_first: bool  # loads with an L2 evict-first policy (decode attention's K/V, while prefetching)


def _signature(launch: Launch) -> tuple[dict, dict, dict]:
    """The (signature, constexprs, attrs) Triton's JIT would compile this launch with."""
    signature, constexprs, attrs = {}, {}, {}
    for index, param in enumerate(launch.kernel.params):
        value = launch.args[param.name]
        if param.is_constexpr or (type(value) is int and value == 1 and not param.do_not_specialize):
            signature[param.name], constexprs[(index,)] = "constexpr", value
            continue
        if isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TRITON_DTYPES[value.dtype]
            divisible = value.data_ptr() % 16 == 0
        elif isinstance(value, bool):
            signature[param.name], divisible = "u1", False
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            divisible = value % 16 == 0
        elif isinstance(value, float):
            signature[param.name], divisible = "fp32", False
        else:
            raise TypeError(f"{launch.label}: argument {param.name} of type {type(value).__name__}")
        if divisible and not param.do_not_specialize and not param.do_not_specialize_on_alignment:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _resources(cubin: bytes) -> dict[str, int]:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    return {key: int(value) for key, value in re.findall(r"(REG|LOCAL):(\d+)", out)}


def compile_for_hopper(launch: Launch, source: ASTSource) -> Compiled:
    compiled = triton.compile(source, target=HOPPER, options=launch.options)
    used = _resources(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    return Compiled(launch.label, launch.kernel.__name__, used["REG"], used["LOCAL"], compiled.metadata.shared,
                    ptx.count("cp.async."), _waits_first(ptx), _tensor_cores(ptx), _l1_loads_after_arrival(ptx),
                    ptx.count("cp.async.bulk.prefetch.L2.global"), "createpolicy.fractional.L2::evict_first" in ptx)


def _l1_loads_after_arrival(ptx: str) -> int:
    """Loads after a kernel's first atomic that may hit this SM's L1: the last program to
    arrive reads what other SMs wrote, which only L2 holds (ld.global.cg, cp.async.cg)."""
    if "atom.global" not in ptx:
        return 0
    after = ptx[ptx.index("atom.global"):]
    return len(re.findall(r"ld\.global(?!\.cg)|cp\.async\.ca", after))


def _tensor_cores(ptx: str) -> str:
    return "wgmma" if "wgmma.mma_async" in ptx else "mma" if "mma.sync" in ptx else ""


def _waits_first(ptx: str) -> bool:
    """The kernel's text has griddepcontrol.wait before its first global load, store, async
    copy or atomic (the wait sits in the entry block, which comes first). Weight prefetches into
    L2 may come before it: they read what no kernel writes."""
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    accesses = [match.start() for match in re.finditer(r"ld\.global|st\.global|cp\.async(?!\.bulk\.prefetch)|atom\.|red\.",
                                                       body)]
    return wait >= 0 and all(wait < i for i in accesses)


class LaunchCatcher:
    """Inside, every Triton launch is recorded (under the current `label`) instead of run; with
    `dependent_launch`, as an H100 launches it when `specserve_kernels.dependent_launch.ENABLED` is set."""

    def __init__(self, dependent_launch: bool = False):
        self.dependent_launch = dependent_launch
        self.launches: list[Launch] = []
        self.label = ""

    def __enter__(self) -> LaunchCatcher:
        catcher = self

        def catch(kernel: JITFunction, *args, grid, warmup, **kwargs):
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl") if k in kwargs}
            if catcher.dependent_launch and "DEPENDENT_LAUNCH" in kwargs:
                kwargs["DEPENDENT_LAUNCH"], options["launch_pdl"] = True, True
            bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            catcher.launches.append(Launch(catcher.label, kernel, dict(bound.arguments), options))

        self._original_run, JITFunction.run = JITFunction.run, catch
        return self

    def __exit__(self, *exc) -> None:
        JITFunction.run = self._original_run


# Llama-3-8B: heads, KV heads, head_dim, hidden, intermediate, vocabulary; 16-token cache blocks
LLAMA3_8B = (32, 8, 128, 4096, 14336, 128256)
BLOCK = 16


def _tuned_decode() -> dict:
    from specserve_kernels.backend import TUNED_16BIT_DECODE
    return dict(partition_size=TUNED_16BIT_DECODE["partition_size"], split_size=TUNED_16BIT_DECODE["split_size"],
                **TUNED_16BIT_DECODE["decode_options"])


def caught_launches(dependent_launch: bool = False) -> list[Launch]:
    """Every launch of the CUDA path's kernels at a Llama-3-8B decode step's shapes, caught
    instead of run."""
    from specserve_kernels.argmax import argmax_rows
    from specserve_kernels.decode_attention import decode_attention
    from specserve_kernels.filtered_sampling import filtered_sample
    from specserve_kernels.gate_up_silu import ROW_CONFIGS, gate_up_silu
    from specserve_kernels.l2_prefetch import MAX_BYTES, PROGRAMS, Prefetch
    from specserve_kernels.prefill_attention import prefill_attention
    from specserve_kernels.rmsnorm import rms_norm
    from specserve_kernels.rotary_kv_write import rotary_write_kv
    from specserve_kernels.silu_mul import silu_and_mul
    from specserve_kernels.skinny_linear import skinny_linear

    bf16 = dict(dtype=torch.bfloat16)
    heads, kv_heads, head_dim, hidden, intermediate, vocab = LLAMA3_8B
    batch, block, blocks_per_seq, reach = 4, BLOCK, 64, 1024
    k_cache = torch.zeros(batch * blocks_per_seq, block, kv_heads, head_dim, **bf16)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.arange(batch * blocks_per_seq, dtype=torch.int32).view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), 700, dtype=torch.int32)
    query = torch.zeros(batch, heads, head_dim, **bf16)
    decode = _tuned_decode()
    with LaunchCatcher(dependent_launch) as catcher:
        for catcher.label, per_split, max_seq_len in (("decode, a program per partition", False, reach),
                                                      ("decode, a program per partition, long", False, 8 * reach),
                                                      ("decode, a program per split", True, reach)):
            decode_attention(query, k_cache, v_cache, tables, seq_lens, 0.1, max_seq_len,
                             program_per_split=per_split, **decode)
        catcher.label = "decode, a program per split, merged by the last"
        decode_attention(query, k_cache, v_cache, tables, seq_lens, 0.1, reach, program_per_split=True,
                         merge_by_last_program=True, **decode)
        catcher.label = "decode, K/V evict-first (while prefetching weights)"
        decode_attention(query, k_cache, v_cache, tables, seq_lens, 0.1, reach, kv_evict_first=True, **decode)
        catcher.label = "decode, fp32 (the engine's exact mode)"
        decode_attention(query.float(), k_cache.float(), v_cache.float(), tables, seq_lens, 0.1, 8 * reach,
                         program_per_split=False)
        catcher.label = "prefill (a verifying step: 5 query tokens)"
        query_start = torch.arange(0, 5 * batch + 1, 5, dtype=torch.int32)
        prefill_attention(torch.zeros(5 * batch, heads, head_dim, **bf16), k_cache, v_cache, tables,
                          query_start, seq_lens - 5, 0.1, 5)
        catcher.label = "layer ops"
        x = torch.zeros(batch, hidden, **bf16)
        rms_norm(x, torch.ones(hidden, **bf16), 1e-5, residual=torch.zeros_like(x))
        rms_norm(x, torch.ones(hidden, **bf16), 1e-5)
        q, k, v = (torch.zeros(batch, n, head_dim, **bf16) for n in (heads, kv_heads, kv_heads))
        cos = torch.zeros(batch, head_dim, **bf16)
        rotary_write_kv(q, k, v, cos, cos.clone(), k_cache, v_cache, torch.arange(batch, dtype=torch.int64))
        silu_and_mul(torch.zeros(batch, 2 * intermediate, **bf16))
        catcher.label = "layer ops, prefetching the next weight"
        next_weight = torch.zeros(hidden, hidden, **bf16)  # o_proj's, over attention
        prefetch = Prefetch(next_weight, MAX_BYTES["attention"], PROGRAMS)
        rms_norm(x, torch.ones(hidden, **bf16), 1e-5, residual=torch.zeros_like(x), prefetch=prefetch)
        rotary_write_kv(q, k, v, cos, cos.clone(), k_cache, v_cache, torch.arange(batch, dtype=torch.int64),
                        prefetch=prefetch)
        catcher.label = "draws in the graph"
        logits, temperature = torch.zeros(batch, vocab, **bf16), torch.ones(batch)
        drawn = filtered_sample(logits, temperature, torch.ones(batch), torch.zeros(batch),
                                torch.zeros(batch, 4, dtype=torch.float64))
        argmax_rows(logits, torch.zeros_like(drawn), temperature, drawn, torch.zeros_like(drawn))
        catcher.label = "argmax in a verifying step's graph"
        argmax_rows(logits, torch.zeros_like(drawn))
        catcher.label = "skinny linear (qkv, batch 1)"
        qkv_features = (heads + 2 * kv_heads) * head_dim
        skinny_linear(torch.zeros(1, hidden, **bf16), torch.zeros(qkv_features, hidden, **bf16))
        catcher.label = "skinny linear, split-K (o_proj, batch 256)"
        skinny_linear(torch.zeros(256, hidden, **bf16), torch.zeros(hidden, hidden, **bf16), None,
                      dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, NUM_STAGES=3, num_warps=8, SPLIT_K=4))
        for rows, _ in ROW_CONFIGS:  # each configuration at the largest batch it takes
            catcher.label = f"gate_up with SiLU x up (batch {rows})"
            gate_up_silu(torch.zeros(rows, hidden, **bf16), torch.zeros(2 * intermediate, hidden, **bf16))
    return catcher.launches


def eager_variants() -> dict[str, int]:
    """How many variants of each kernel Triton's JIT compiles over the shapes of steps no CUDA
    graph covers (prompts, mixed steps, long contexts): 1 to 37 tokens, block tables 1 to 4,096
    blocks wide (1 to 64 partitions), 2, 5 and 37 query tokens a sequence in prefill. Each variant is a
    compile of a second or more, paid by the first request that meets it; only a kernel's own
    choices (a constexpr, a dtype) should make one."""
    from specserve_kernels.decode_attention import decode_attention
    from specserve_kernels.filtered_sampling import filtered_sample
    from specserve_kernels.gate_up_silu import gate_up_silu
    from specserve_kernels.prefill_attention import prefill_attention
    from specserve_kernels.rmsnorm import rms_norm
    from specserve_kernels.rotary_kv_write import rotary_write_kv
    from specserve_kernels.silu_mul import silu_and_mul
    from specserve_kernels.skinny_linear import MAX_ROWS, skinny_linear

    bf16 = dict(dtype=torch.bfloat16)
    heads, kv_heads, head_dim, hidden, intermediate, vocab = LLAMA3_8B
    block = BLOCK
    k_cache = torch.zeros(1, block, kv_heads, head_dim, **bf16)  # never read: nothing runs
    with LaunchCatcher() as catcher:
        for batch, width in ((1, 1), (3, 5), (2, 16), (2, 70), (1, 1024), (1, 4096)):
            tables = torch.zeros(batch, width, dtype=torch.int32)
            seq_lens = torch.full((batch,), width * block, dtype=torch.int32)
            decode_attention(torch.zeros(batch, heads, head_dim, **bf16), k_cache, k_cache, tables, seq_lens,
                             0.1, width * block, **_tuned_decode())
            for query_len in (2, 5, 37):  # Llama-3-8B's group of 4: query tiles of 4, 8 and 16 tokens
                prefill_attention(torch.zeros(query_len * batch, heads, head_dim, **bf16), k_cache, k_cache, tables,
                                  torch.arange(0, query_len * batch + 1, query_len, dtype=torch.int32),
                                  seq_lens - query_len, 0.1, query_len)
        for tokens in (1, 5, 16, 37):
            x = torch.zeros(tokens, hidden, **bf16)
            rms_norm(x, torch.ones(hidden, **bf16), 1e-5, residual=torch.zeros_like(x))
            rms_norm(x, torch.ones(hidden, **bf16), 1e-5)
            qkv = torch.zeros(tokens, heads + 2 * kv_heads, head_dim, **bf16)  # q, k, v: views of one output
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            cos = torch.zeros(tokens, head_dim, **bf16)
            rotary_write_kv(q, k, v, cos, cos.clone(), k_cache, k_cache, torch.arange(tokens, dtype=torch.int64))
            silu_and_mul(torch.zeros(tokens, 2 * intermediate, **bf16))
            rows = dict(temperature=torch.ones(tokens), top_p=torch.ones(tokens), min_p=torch.zeros(tokens),
                        u=torch.zeros(tokens, 4, dtype=torch.float64))
            filtered_sample(torch.zeros(tokens, vocab, **bf16), **rows)  # in a graph: the model's dtype
            filtered_sample(torch.zeros(tokens, vocab), **rows)  # outside: fp32
            filtered_sample(torch.zeros(tokens, vocab), **rows, floor=torch.zeros(tokens))  # a top-k cut
            if tokens <= MAX_ROWS:
                skinny_linear(x, torch.zeros(hidden, hidden, **bf16))
            gate_up_silu(x, torch.zeros(2 * intermediate, hidden, **bf16))  # 37 tokens: the second row configuration
    variants: dict[str, set[str]] = {}
    for launch in catcher.launches:
        signature, constexprs, attrs = _signature(launch)
        key = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                    sorted(launch.options.items())))
        variants.setdefault(launch.kernel.__name__, set()).add(key)
    return {name: len(keys) for name, keys in variants.items()}


def main() -> None:
    assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET: it replaces triton.jit"
    try:  # Triton's internals this relies on (the JIT's launch method, ASTSource's arguments)
        if "--eager-variants" in sys.argv:
            print(json.dumps(eager_variants()))
            return
        launches = caught_launches("--dependent-launch" in sys.argv)
        sources = [ASTSource(launch.kernel, *_signature(launch)) for launch in launches]
        assert launches, "no launch caught"
    except Exception as exc:  # noqa: BLE001 - a Triton this harness does not know: nothing checked
        print(f"cannot catch the launches with Triton {triton.__version__}: {exc!r}", file=sys.stderr)
        sys.exit(HARNESS_UNSUPPORTED)
    results = [compile_for_hopper(launch, source) for launch, source in zip(launches, sources)]
    if "--json" in sys.argv:
        print(json.dumps([asdict(r) for r in results]))
        return
    print(f"Triton {triton.__version__}, target {HOPPER}")
    print(f"{'launch':<44} {'kernel':<26} {'regs':>5} {'local':>6} {'shared':>7} {'cp.async':>8} {'PDL wait':>8} {'dots':>6}")
    for r in results:
        print(f"{r.label:<44} {r.kernel:<26} {r.registers:>5} {r.local_bytes:>6} {r.shared_bytes:>7} "
              f"{r.async_copies:>8} {'first' if r.waits_first else '':>8} {r.tensor_cores:>6}")


if __name__ == "__main__":
    main()
