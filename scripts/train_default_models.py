#!/usr/bin/env python
"""Train specserve's default model pair: a tiny Llama target and a tinier Llama draft.

Why this exists: the repo ships a small target/draft pair with a shared tokenizer so that
`serve run serve_config.yaml` works on any laptop with no download. The training text is the
Python standard library's own `.py` sources, which every machine that runs specserve has, so
anyone can rebuild the checkpoints bit-for-bit-ish from this one file (CPU, ~20 minutes).

Steps:
  1. collect stdlib sources, hold out ~1% of files (by hash of the relative path);
  2. train one byte-level BPE tokenizer (vocab 4096) shared by both models;
  3. train the target (~7M params), then the draft (~1M params), then distill the draft on the
     target's soft outputs (KL) so the two agree more often during speculative decoding;
  4. save both in Hugging Face format (safetensors, fp32) with the tokenizer files;
  5. evaluate held-out loss and draft/target greedy agreement; write training_report.json.

Usage:
  nice -n 10 python scripts/train_default_models.py --target-minutes 15 --draft-minutes 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

# The tokenizers library's thread pool spins badly on a busy 2-core box; one thread is faster.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from default_tokenizer import (MAX_POSITIONS, SPECIAL_TOKENS, VOCAB_SIZE,  # noqa: E402
                               check_round_trip, encode_stream, save_tokenizer, train_tokenizer,
                               wrap_tokenizer)

SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__"}


# --------------------------------------------------------------------------------------------
# 1. Data
# --------------------------------------------------------------------------------------------


def collect_stdlib_sources(holdout_percent: int = 1) -> tuple[list[str], list[str], list[str]]:
    """Return (train_docs, heldout_docs, heldout_paths) from the stdlib's .py files.

    Files are sorted so the corpus is identical on every run; the held-out split is chosen by a
    hash of the relative path (not by random state) so it never leaks into training.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    heldout: list[str] = []
    heldout_paths: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of latin-1 test fixtures; not worth special-casing
        if not text.strip():
            continue
        bucket = int(hashlib.sha256(rel.as_posix().encode()).hexdigest(), 16) % 100
        if bucket < holdout_percent:
            heldout.append(text)
            heldout_paths.append(rel.as_posix())
        else:
            train.append(text)
    return train, heldout, heldout_paths


# --------------------------------------------------------------------------------------------
# 3. Models and training
# --------------------------------------------------------------------------------------------


def make_config(hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> LlamaConfig:
    """Llama config with the shared tokenizer's special ids; tied embeddings keep files small."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        # <|endoftext|> ends a document, <|end|> ends a chat turn: either stops generation.
        eos_token_id=[0, 4],
        pad_token_id=0,
        torch_dtype="float32",
    )


@dataclass
class TrainResult:
    """What the report needs about one training run."""

    steps: int
    tokens_seen: int
    wall_s: float
    final_train_loss: float  # mean CE over the last 20 steps
    distill_steps: int = 0
    final_distill_kl: float | None = None


def sample_batch(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Random contiguous windows of seq+1 tokens (inputs plus next-token labels)."""
    starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


def lr_at(step: int, frac: float, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup by steps, then cosine decay by elapsed-time fraction (the budget is time,
    so the number of steps is not known up front)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(max(frac, 0.0), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def train(
    name: str,
    model: LlamaForCausalLM,
    stream: torch.Tensor,
    minutes: float,
    *,
    batch: int,
    seq: int,
    lr: float,
    seed: int,
    teacher: LlamaForCausalLM | None = None,
    distill_fraction: float = 0.0,
    warmup: int = 10,
    log_every_s: float = 60.0,
    sample=sample_batch,
) -> TrainResult:
    """Time-budgeted AdamW training. If a teacher is given, the last `distill_fraction` of the
    budget minimises KL(teacher || student) on the teacher's full next-token distribution,
    which directly targets how often the draft's guesses are accepted. `sample(stream, batch,
    seq, gen)` draws each step's windows (default: random windows of the stream)."""
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    budget = minutes * 60.0
    distill_start = budget * (1.0 - distill_fraction) if teacher is not None else float("inf")
    model.train()
    t0 = last_log = time.time()
    step = distill_steps = 0
    ce_hist: list[float] = []
    kl_hist: list[float] = []
    while True:
        elapsed = time.time() - t0
        if elapsed >= budget:
            break
        distilling = elapsed >= distill_start
        for group in opt.param_groups:
            group["lr"] = lr_at(step, elapsed / budget, lr, warmup)
        window = sample(stream, batch, seq, gen)
        x, y = window[:, :-1], window[:, 1:]
        logits = model(input_ids=x).logits
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if distilling:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(input_ids=x).logits, dim=-1)
            s_logp = F.log_softmax(logits, dim=-1)
            kl = F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
            loss = kl
            kl_hist.append(kl.item())
            distill_steps += 1
        else:
            loss = ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ce_hist.append(ce.item())
        step += 1
        now = time.time()
        if now - last_log >= log_every_s or step == 1:
            last_log = now
            tok_s = step * batch * seq / (now - t0)
            msg = f"[{name}] step {step:5d}  {now - t0:6.0f}s  ce {sum(ce_hist[-20:]) / len(ce_hist[-20:]):.3f}"
            if kl_hist:
                msg += f"  kl {sum(kl_hist[-20:]) / len(kl_hist[-20:]):.3f}"
            msg += f"  lr {opt.param_groups[0]['lr']:.2e}  {tok_s:,.0f} tok/s"
            print(msg, flush=True)
    wall = time.time() - t0
    model.eval()
    result = TrainResult(
        steps=step,
        tokens_seen=step * batch * seq,
        wall_s=round(wall, 1),
        final_train_loss=round(sum(ce_hist[-20:]) / max(len(ce_hist[-20:]), 1), 4),
        distill_steps=distill_steps,
        final_distill_kl=round(sum(kl_hist[-20:]) / len(kl_hist[-20:]), 4) if kl_hist else None,
    )
    print(f"[{name}] done: {result}", flush=True)
    return result


# --------------------------------------------------------------------------------------------
# 4./5. Saving and evaluation
# --------------------------------------------------------------------------------------------


def save_model(model: LlamaForCausalLM, hf_tok: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """HF format, fp32 safetensors, tokenizer alongside so each dir is self-contained."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[0, 4], pad_token_id=0)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(hf_tok, out_dir)


@torch.no_grad()
def evaluate(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    stream: torch.Tensor,
    seq: int,
    max_positions: int,
) -> dict[str, float | int]:
    """Held-out mean CE of each model, and how often argmax(draft) == argmax(target) — the
    greedy acceptance rate that bounds speculative decoding's speed-up."""
    n_windows = max(1, min((len(stream) - 1) // seq, math.ceil(max_positions / seq)))
    ce_t = ce_d = 0.0
    agree = positions = 0
    for i in range(n_windows):
        w = stream[i * seq : i * seq + seq + 1].unsqueeze(0)
        x, y = w[:, :-1], w[:, 1:]
        lt = target(input_ids=x).logits[0]
        ld = draft(input_ids=x).logits[0]
        ce_t += F.cross_entropy(lt, y[0], reduction="sum").item()
        ce_d += F.cross_entropy(ld, y[0], reduction="sum").item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        positions += y.numel()
    return {
        "heldout_positions": positions,
        "target_heldout_loss": round(ce_t / positions, 4),
        "draft_heldout_loss": round(ce_d / positions, 4),
        "greedy_agreement": round(agree / positions, 4),
    }


def n_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", default="checkpoints")
    ap.add_argument("--target-minutes", type=float, default=15.0)
    ap.add_argument("--draft-minutes", type=float, default=5.0)
    ap.add_argument("--distill-fraction", type=float, default=0.3,
                    help="share of the draft budget spent distilling from the target (0 disables)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=2,
                    help="small batches: on a CPU budget, more optimizer steps per token win")
    ap.add_argument("--eval-positions", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; on a shared, niced 2-core box 1 beats 2 (OpenMP barriers stall)")
    args = ap.parse_args()

    t_start = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    train_docs, heldout_docs, heldout_paths = collect_stdlib_sources()
    print(f"stdlib: {len(train_docs)} train files, {len(heldout_docs)} held-out files: {heldout_paths}", flush=True)

    tok = train_tokenizer(train_docs)
    hf_tok = wrap_tokenizer(tok)
    tok_dir = out / "tiny-target"
    tok_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(hf_tok, tok_dir)
    check_round_trip(tok_dir, [
        "def f(x):\n\treturn x  # é ü 中文 🙂\n\n",
        "  leading spaces, trailing  \r\n",
        "<|user|>\nhi<|end|>\n",
        heldout_docs[0] if heldout_docs else "",
    ])
    train_stream = encode_stream(tok, train_docs)
    heldout_stream = encode_stream(tok, heldout_docs)
    print(f"tokens: train {len(train_stream):,}  held-out {len(heldout_stream):,}", flush=True)

    target = LlamaForCausalLM(make_config(hidden=256, layers=8, heads=8, kv_heads=4, inter=768))
    draft = LlamaForCausalLM(make_config(hidden=128, layers=3, heads=4, kv_heads=2, inter=384))
    print(f"params: target {n_params(target):,}  draft {n_params(draft):,}", flush=True)

    common = dict(batch=args.batch_size, seq=args.seq_len, seed=args.seed)
    t_res = train("target", target, train_stream, args.target_minutes, lr=3e-3, **common)
    for p in target.parameters():
        p.requires_grad_(False)
    d_res = train("draft", draft, train_stream, args.draft_minutes, lr=3e-3,
                  teacher=target, distill_fraction=args.distill_fraction, log_every_s=30.0, **common)

    save_model(target, hf_tok, out / "tiny-target")
    save_model(draft, hf_tok, out / "tiny-draft")

    metrics = evaluate(target, draft, heldout_stream, args.seq_len, args.eval_positions)
    print(f"held-out: {metrics}", flush=True)

    report = {
        "command": "python " + shlex.join(sys.argv),
        "machine": f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__}, no GPU",
        "total_wall_s": round(time.time() - t_start, 1),
        "data": {
            "source": "python stdlib .py files",
            "train_files": len(train_docs),
            "heldout_files": heldout_paths,
            "train_tokens": len(train_stream),
            "heldout_tokens": len(heldout_stream),
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tok.get_vocab_size(), "special_tokens": SPECIAL_TOKENS},
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "torch_threads": args.threads,
        "target": {"params": n_params(target), **vars(t_res)},
        "draft": {"params": n_params(draft), **vars(d_res)},
        "heldout": metrics,
    }
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
