"""Guided decoding costs, measured side by side in one run:

1. compile: each format compiled cold (fresh cache) and looked up again (cached), and the ratio;
2. transport: what moving a compiled index to a target replica costs (pickle size and time,
   and a Ray object round trip through a second worker process);
3. throughput: output tokens/s of unguided vs guided greedy generation through specserve's
   engine on a key-heavy schema at batch 1 and 32, jump-forward off and on.

    python benchmarks/guided.py --model checkpoints/tiny-target

`--engine module:factory` measures another engine instead: `factory(model: str,
jump_forward: bool) -> generate`, where
`generate(prompts: list[list[int]], formats: list[dict | None], max_tokens: int) -> list[int]`
runs one batch (a format per prompt, None for free text, in `regex_for_format`'s shape) and
returns the number of output tokens of each request.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import pickle
import statistics
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The repository on sys.path: run as a script, only this folder is.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.guided.compiler import IndexCache, regex_for_format  # noqa: E402
from app.guided.vocabulary import GuidedVocabulary, load_guided_vocabulary  # noqa: E402

KEY_HEAVY = {"type": "object", "required": [f"field_number_{i}" for i in range(8)],
             "properties": {f"field_number_{i}": {"type": "integer"} for i in range(8)}}
FORMATS = {
    "key_heavy": {"type": "json_schema", "json_schema": {"schema": KEY_HEAVY}},
    "key_heavy_compact": {"type": "json_schema", "json_schema": {"schema": KEY_HEAVY},
                          "whitespace_pattern": ""},
    "nested": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "required": ["user", "tags"], "properties": {
            "user": {"type": "object", "required": ["name", "email"], "properties": {
                "name": {"type": "string", "maxLength": 20},
                "email": {"type": "string", "format": "email"}}},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                     "minItems": 1, "maxItems": 4}}}}},
    "json_object": {"type": "json_object"},
    "regex": {"type": "regex", "pattern": r"[0-9]{3}-[0-9]{3}-[0-9]{4}"},
}
GenerateFn = Callable[[list[list[int]], list[dict | None], int], list[int]]


def bench_compile(vocab: GuidedVocabulary, repeats: int) -> dict[str, tuple[float, float]]:
    """Per format: (median cold compile s, median cached lookup s)."""
    out = {}
    for name, fmt in FORMATS.items():
        regex = regex_for_format(fmt)
        cold, cached = [], []
        for _ in range(repeats):
            cache = IndexCache()
            start = time.perf_counter()
            cache.get_or_compile(regex, vocab, 120)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            cache.get_or_compile(regex, vocab, 120)
            cached.append(time.perf_counter() - start)
        out[name] = (statistics.median(cold), statistics.median(cached))
    return out


def bench_transport(vocab: GuidedVocabulary) -> dict[str, tuple[int, float, float, float]]:
    """Per format: (pickled bytes, pickle s, unpickle s, Ray round trip s through an actor)."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, regex: str, model: str):
            from app.guided.compiler import compile_regex
            self.index = compile_regex(regex, load_guided_vocabulary(model))

        def get(self):
            return self.index

    out = {}
    try:
        for name, fmt in FORMATS.items():
            regex = regex_for_format(fmt)
            index = IndexCache().get_or_compile(regex, vocab, 120)
            start = time.perf_counter()
            blob = pickle.dumps(index)
            dump_s = time.perf_counter() - start
            start = time.perf_counter()
            pickle.loads(blob)
            load_s = time.perf_counter() - start
            holder = Holder.remote(regex, ARGS.model)
            ray.get(holder.get.remote())  # warm: actor up, index compiled
            trips = []
            for _ in range(5):
                start = time.perf_counter()
                ray.get(holder.get.remote())
                trips.append(time.perf_counter() - start)
            out[name] = (len(blob), dump_s, load_s, statistics.median(trips))
            ray.kill(holder)
    finally:
        ray.shutdown()
    return out


def bench_throughput(factory: Callable[[str, bool], GenerateFn], model: str, max_tokens: int
                     ) -> dict[tuple[str, int], float]:
    """Output tokens/s per (mode, batch): unguided, guided, guided + jump-forward."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model, local_files_only=True)
    prompt = tok.encode("Fill in the record as JSON:", add_special_tokens=False)
    fmt = FORMATS["key_heavy_compact"]
    modes = {"unguided": (False, None), "guided": (False, fmt), "guided+jump": (True, fmt)}
    out = {}
    for jump_forward in (False, True):
        generate = factory(model, jump_forward)
        generate([prompt], [fmt], 8)  # warm-up (compile, first forward)
        for mode, (jf, mode_fmt) in modes.items():
            if jf != jump_forward:
                continue
            for batch in (1, 32):
                start = time.perf_counter()
                counts = generate([prompt] * batch, [mode_fmt] * batch, max_tokens)
                out[(mode, batch)] = sum(counts) / (time.perf_counter() - start)
    return out


def engine_generate(model: str, jump_forward: bool) -> GenerateFn:
    """specserve's engine in-process, formats compiled once through an IndexCache."""
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from app.guided.guide import GuidedDecoder
    from app.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, enable_jump_forward=jump_forward))
    vocab, cache = load_guided_vocabulary(model), IndexCache()
    width = engine.model_config.vocab_size
    calls = iter(range(10**9))

    def generate(prompts: list[list[int]], formats: list[dict | None], max_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        ids = [f"r{next(calls)}" for _ in prompts]
        for rid, prompt, fmt in zip(ids, prompts, formats):
            guide = None
            if fmt is not None:
                guide = GuidedDecoder(cache.get_or_compile(regex_for_format(fmt), vocab, 60.0), vocab, width)
            engine.add_request(rid, prompt, params, guide)
        counts = dict.fromkeys(ids, 0)
        while engine.has_unfinished_requests():
            for out in engine.step():
                counts[out.request_id] += len(out.new_token_ids)
        return [counts[rid] for rid in ids]

    return generate


def main() -> None:
    vocab = load_guided_vocabulary(ARGS.model)
    print(f"vocabulary {ARGS.model}: {len(vocab.token_bytes)} ids, hash {vocab.vocab_hash[:12]}")
    print("\ncompile (median of", ARGS.repeats, "runs)")
    print(f"{'format':20} {'cold ms':>10} {'cached ms':>10} {'ratio':>10}")
    for name, (cold, cached) in bench_compile(vocab, ARGS.repeats).items():
        print(f"{name:20} {cold * 1e3:10.2f} {cached * 1e3:10.4f} {cold / cached:10.0f}x")
    if not ARGS.skip_transport:
        print("\nindex transport")
        print(f"{'format':20} {'pickled KB':>10} {'dump ms':>8} {'load ms':>8} {'ray ms':>8}")
        for name, (size, dump_s, load_s, trip_s) in bench_transport(vocab).items():
            print(f"{name:20} {size / 1024:10.1f} {dump_s * 1e3:8.2f} {load_s * 1e3:8.2f} "
                  f"{trip_s * 1e3:8.2f}")
    if not ARGS.skip_throughput:
        factory = engine_generate
        if ARGS.engine:
            module, _, attr = ARGS.engine.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        rates = bench_throughput(factory, ARGS.model, ARGS.max_tokens)
        print("\nthroughput, key-heavy schema (compact JSON), output tokens/s")
        for batch in (1, 32):
            base = rates[("unguided", batch)]
            row = "  ".join(f"{mode} {rates[(mode, batch)]:8.1f} ({rates[(mode, batch)] / base:.2f}x)"
                            for mode in ("unguided", "guided", "guided+jump"))
            print(f"batch {batch:3}: {row}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="checkpoints/tiny-target")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--engine", help="module:factory building a generate function")
    parser.add_argument("--skip-transport", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    ARGS = parser.parse_args()
    main()
