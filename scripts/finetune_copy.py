#!/usr/bin/env python
"""Fine-tune the default pair to copy and edit text given in the prompt.

Why: speculative decoding pays when the target's output repeats its input (code edits,
summaries that quote, document QA). A real 8B model does that when asked; the toy pair trained
by `train_default_models.py` on plain stdlib sources does not (measured: prompt lookup accepted
10% of the time on "copy the code above"), so neither speculation path can show what it does.
This continues training both models on a mix of plain stdlib windows and *copy documents*: a
snippet, a marker line, then the snippet again (sometimes with one identifier renamed), and
distills the draft from the fine-tuned target so the pair still agrees.

Snippets come from the same training files as before; the held-out files give the copy
evaluation (greedy accuracy on the copied part, and draft/target agreement there).

Usage (about 16 minutes a round on 2 quiet cores; the shipped pair had three rounds, see
benchmarks/RESULTS.md; each round appends to the output's training_report.json):
  python scripts/finetune_copy.py --source-dir checkpoints --output-dir /tmp/copy \
      --target-minutes 10 --draft-minutes 4 --copy-share 0.8 --lr 2e-3
"""

from __future__ import annotations

import argparse
import json
import keyword
import random
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from default_tokenizer import EOS, encode_stream  # noqa: E402
from train_default_models import collect_stdlib_sources, evaluate, sample_batch, save_model, train  # noqa: E402

COPY_TEMPLATES = [
    "# Original:\n{a}\n\n# Copy of the code above:\n{a}\n",
    "{a}\n\n# The same code again, unchanged:\n{a}\n",
    "# Code:\n{a}\n\n# Repeat it exactly:\n{a}\n",
]
EDIT_TEMPLATE = "# Before:\n{a}\n\n# After renaming `{old}` to `{new}`:\n{b}\n"
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")


def snippet(rng: random.Random, docs: list[str], max_chars: int = 900) -> str:
    """2 to 25 consecutive lines of one document (short ones most often), cut at a line
    boundary."""
    while True:
        lines = rng.choice(docs).splitlines()
        if len(lines) < 5:
            continue
        n = min(rng.randint(2, 25), rng.randint(2, 25))
        start = rng.randrange(0, max(1, len(lines) - n))
        out = ""
        for line in lines[start:start + n]:
            if len(out) + len(line) + 1 > max_chars:
                break
            out += line + "\n"
        out = out.rstrip("\n")
        if len(out.strip()) >= 40:
            return out


def copy_document(rng: random.Random, docs: list[str], edit_share: float = 0.3) -> tuple[str, str]:
    """(prefix up to and including the marker line, full document)."""
    a = snippet(rng, docs)
    names = [w for w in IDENTIFIER.findall(a) if not keyword.iskeyword(w)]
    if names and rng.random() < edit_share:
        old = rng.choice(names)
        new = rng.choice([old + "_new", "new_" + old, old.upper(), old + "2", "renamed"])
        b = re.sub(rf"\b{re.escape(old)}\b", new, a)
        full = EDIT_TEMPLATE.format(a=a, old=old, new=new, b=b)
        return full[: len(full) - len(b) - 1], full
    template = rng.choice(COPY_TEMPLATES)
    full = template.format(a=a)
    return full[: len(full) - len(a) - 1], full


def copy_sampler(tok: Tokenizer, docs: list[str], share: float, seed: int):
    """A `sample` for `train`: each row is, with probability `share`, copy documents packed back
    to back (many copies per window: copying is learned from how often it is seen); otherwise a
    random plain window."""
    rng = random.Random(seed)
    eos = tok.token_to_id(EOS)

    def sample(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
        rows = sample_batch(stream, batch, seq, gen)
        for i in range(batch):
            if rng.random() < share:
                ids: list[int] = []
                while len(ids) < seq + 1:
                    ids += tok.encode(copy_document(rng, docs)[1], add_special_tokens=False).ids + [eos]
                rows[i] = torch.tensor(ids[: seq + 1])
        return rows

    return sample


@torch.no_grad()
def copy_accuracy(target, draft, tok: Tokenizer, docs: list[str], n: int, seed: int) -> dict:
    """Greedy next-token accuracy of each model on the copied part of n held-out copy
    documents, and how often draft and target agree there: what bounds prompt-lookup and
    draft-model acceptance on input-grounded requests."""
    rng = random.Random(seed)
    hits_t = hits_d = agree = positions = 0
    for _ in range(n):
        prefix, full = copy_document(rng, docs)
        p_ids = tok.encode(prefix, add_special_tokens=False).ids
        ids = tok.encode(full, add_special_tokens=False).ids
        if ids[: len(p_ids)] != p_ids:
            continue
        x = torch.tensor([ids])
        pt = target(input_ids=x).logits[0, len(p_ids) - 1:-1].argmax(-1)
        pd = draft(input_ids=x).logits[0, len(p_ids) - 1:-1].argmax(-1)
        y = x[0, len(p_ids):]
        hits_t += (pt == y).sum().item()
        hits_d += (pd == y).sum().item()
        agree += (pt == pd).sum().item()
        positions += y.numel()
    return {"copy_positions": positions, "target_copy_accuracy": round(hits_t / positions, 4),
            "draft_copy_accuracy": round(hits_d / positions, 4),
            "copy_greedy_agreement": round(agree / positions, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", default="checkpoints")
    ap.add_argument("--output-dir", default="checkpoints")
    ap.add_argument("--target-minutes", type=float, default=9.0)
    ap.add_argument("--draft-minutes", type=float, default=5.0)
    ap.add_argument("--copy-share", type=float, default=0.5, help="share of rows that are copy documents")
    ap.add_argument("--distill-fraction", type=float, default=0.5)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()

    t_start = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    src, out = Path(args.source_dir), Path(args.output_dir)
    tok = Tokenizer.from_file(str(src / "tiny-target" / "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(src / "tiny-target")
    train_docs, heldout_docs, heldout_paths = collect_stdlib_sources()
    train_stream, heldout_stream = encode_stream(tok, train_docs), encode_stream(tok, heldout_docs)
    target = LlamaForCausalLM.from_pretrained(src / "tiny-target", dtype=torch.float32)
    draft = LlamaForCausalLM.from_pretrained(src / "tiny-draft", dtype=torch.float32)
    target.eval(), draft.eval()
    before = {**evaluate(target, draft, heldout_stream, 512, 20000),
              **copy_accuracy(target, draft, tok, heldout_docs, 64, args.seed)}
    print(f"before: {before}", flush=True)

    common = dict(batch=args.batch_size, seq=args.seq_len, seed=args.seed, lr=args.lr, warmup=20)
    t_res = train("target", target, train_stream, args.target_minutes,
                  sample=copy_sampler(tok, train_docs, args.copy_share, args.seed), **common)
    for p in target.parameters():
        p.requires_grad_(False)
    d_res = train("draft", draft, train_stream, args.draft_minutes, teacher=target,
                  distill_fraction=args.distill_fraction, log_every_s=30.0,
                  sample=copy_sampler(tok, train_docs, args.copy_share, args.seed + 1), **common)
    save_model(target, hf_tok, out / "tiny-target")
    save_model(draft, hf_tok, out / "tiny-draft")

    after = {**evaluate(target, draft, heldout_stream, 512, 20000),
             **copy_accuracy(target, draft, tok, heldout_docs, 64, args.seed)}
    print(f"after: {after}", flush=True)
    report_path = out / "training_report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.setdefault("copy_finetune_rounds", []).append({
        "command": "python " + shlex.join(sys.argv),
        "total_wall_s": round(time.time() - t_start, 1),
        "copy_share": args.copy_share, "seq_len": args.seq_len, "batch_size": args.batch_size,
        "heldout_files": heldout_paths,
        "target": vars(t_res), "draft": vars(d_res), "before": before, "after": after,
    })
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["copy_finetune_rounds"][-1], indent=2), flush=True)


if __name__ == "__main__":
    main()
