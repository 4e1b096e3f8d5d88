"""Kernel launches per decoder layer in one decode step, counted on the GPU with torch.profiler.

A decode step at small batches is bound by launches as much as by bandwidth; issue 17's goal
is <= 12 per layer (RMSNorm + residual, qkv GEMM, rotary + KV write, attention, o_proj,
RMSNorm + residual, gate_up GEMM, SiLU * up, down GEMM). Import it from a benchmark or test:

    from benchmarks.kernel_launches import launches_per_layer, kernels_per_layer
    n = launches_per_layer(engine)                      # an LLMEngine (or its ModelRunner) on CUDA
    n = launches_per_layer(model, backend=backend)      # a LlamaForCausalLM on CUDA, as it is:
                                                        # set model.ops first (select_layer_ops)
    names = kernels_per_layer(engine, batch_size=64)    # Counter: kernel name -> launches per layer

or run it on its own (a random Llama-3-8B-shaped model with a few layers, bf16):

    python benchmarks/kernel_launches.py [--layers 4] [--batch-sizes 1 64] [--context 128]

How it counts: the model's eager forward for one decode step (every sequence one new token
after `context_len` cached ones) is profiled with all its layers and again with the last one
left out; the difference in device activities (kernels, and memsets or memcpys if any) is
one layer's, so per-step work (embedding, the rotary table, the final norm) is not charged to
layers. Eager, not a CUDA-graph replay: a graph replays exactly these launches. The step
writes K/V into scratch caches of its own, never into the engine's, so it is safe on an engine
that holds requests.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _unpack(engine_or_model, backend):
    """(model, backend) from an LLMEngine, a ModelRunner or a bare model."""
    runner = getattr(engine_or_model, "runner", engine_or_model)
    if hasattr(runner, "model") and hasattr(runner, "backend"):
        return runner.model, backend or runner.backend
    model = engine_or_model
    if backend is None:
        from app.engine.model_runner import select_attention_backend
        backend = select_attention_backend("auto", next(model.parameters()).device)
    return model, backend


def _decode_step(model, backend, batch_size: int, context_len: int, block_size: int):
    """A closure running one eager decode forward over fresh scratch caches."""
    from specserve_kernels.reference import make_meta
    cfg = model.config
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    blocks_per_seq = -(-(context_len + 1) // block_size)
    shape = (2, batch_size * blocks_per_seq, block_size, cfg.num_key_value_heads, cfg.head_dim)
    caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
    tables = torch.arange(batch_size * blocks_per_seq, dtype=torch.int32).view(batch_size, -1)
    meta = make_meta([1] * batch_size, [context_len] * batch_size, tables, block_size, device)
    input_ids = torch.randint(0, cfg.vocab_size, (batch_size,), device=device)
    positions = torch.full((batch_size,), context_len, dtype=torch.long, device=device)

    @torch.inference_mode()
    def step():
        return model(input_ids, positions, caches, meta, backend)
    return step


def _device_activities(fn) -> collections.Counter:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    for _ in range(2):  # warm-up: Triton compiles, cuBLAS picks its kernels, the allocator fills
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return collections.Counter(e.name for e in prof.events() if e.device_type == DeviceType.CUDA)


def kernels_per_layer(engine_or_model, batch_size: int = 1, context_len: int = 128,
                      backend=None, block_size: int = 16) -> collections.Counter:
    """Device activities of one decoder layer in one decode step, by kernel name."""
    model, backend = _unpack(engine_or_model, backend)
    layers = model.model.layers
    assert len(layers) >= 1, "the model has no decoder layers"
    step = _decode_step(model, backend, batch_size, context_len, block_size)
    full = _device_activities(step)
    try:
        model.model.layers = torch.nn.ModuleList(list(layers)[:-1])
        fewer = _device_activities(step)
    finally:
        model.model.layers = layers
    full.subtract(fewer)
    return collections.Counter({name: n for name, n in full.items() if n})


def launches_per_layer(engine_or_model, batch_size: int = 1, context_len: int = 128,
                       backend=None, block_size: int = 16) -> int:
    """Kernel launches (device activities) per decoder layer in one decode step of
    `batch_size` sequences with `context_len` cached tokens each. CUDA only."""
    return sum(kernels_per_layer(engine_or_model, batch_size, context_len, backend,
                                 block_size).values())


def format_kernels(counts: collections.Counter, width: int = 90) -> str:
    return "\n".join(f"  {n:3d} x {name[:width]}" for name, n in counts.most_common())


def llama3_8b_shaped(layers: int, dtype: torch.dtype = torch.bfloat16, vocab_size: int = 32000):
    """A random Llama-3-8B-shaped model (fewer layers, smaller vocabulary) on the GPU, with
    the layer ops the engine would pick there."""
    from app.models.config import ModelConfig
    from app.models.layer_ops import select_layer_ops
    from app.models.llama import LlamaForCausalLM
    from app.models.rope import RotaryEmbedding
    from specserve_kernels.backend import TritonAttentionBackend
    raw = dict(model_type="llama", vocab_size=vocab_size, hidden_size=4096,
               intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
               num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg = ModelConfig.from_dict(raw)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02) if p.dim() > 1 else p.data.fill_(1.0)
    model.model.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).cuda()
    backend = TritonAttentionBackend()
    model.ops = select_layer_ops(torch.device("cuda"), backend)
    return model, backend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--unfused", action="store_true", help="eager PyTorch layer ops, for the ratio")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernel_launches.py counts CUDA kernels and needs CUDA; nothing run.")
        return 0
    from app.models.layer_ops import TORCH_OPS
    model, backend = llama3_8b_shaped(args.layers)
    variants = [("fused", model.ops)] + ([("unfused", TORCH_OPS)] if args.unfused else [])
    for label, ops in variants:
        model.ops = ops
        for batch in args.batch_sizes:
            counts = kernels_per_layer(model, batch, args.context, backend)
            print(f"{label} ({ops.name} ops), batch {batch}, context {args.context}: "
                  f"{sum(counts.values())} launches per decoder layer")
            print(format_kernels(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
