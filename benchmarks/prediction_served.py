"""Predicted outputs served: `serve run serve_config.yaml` (n-gram speculation, adaptive k; no lookup in
recent outputs, which would replay each answer from the round before), the real
`openai` client, chat, one request at a time, open-ended code prompts whose answers the prompts do
not hold, greedy with `ignore_eos`. Each prompt's answer is asked for once, then every round asks for
each prompt without a prediction and with its answer as the prediction, the two alternated (the
order flips every round). Prints the mean latency of each, their ratio per round and its median, the
prediction tokens the usage says were accepted, and whether every answer was the same.

    python benchmarks/prediction_served.py --rounds 4 --output-len 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai  # noqa: E402

from benchmarks.grounded_prompts import open_ended_texts  # noqa: E402
from benchmarks.servers import ROOT, ServerSpec, running  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "checkpoints" / "tiny-target"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log", default="/tmp/prediction_served.log")
    args = parser.parse_args()
    texts = open_ended_texts(args.prompts, 0)
    # No lookup in recent outputs: it would replay each answer from the rounds before, with or without a prediction
    spec = ServerSpec.parse("specserve:lookup_recent_output_tokens=0")
    with running(spec, args.port, args.model, "tiny-target", Path(args.log)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")

        def ask(text: str, prediction: str | None):
            extra = {"prediction": {"type": "content", "content": prediction}} if prediction is not None else {}
            started = time.perf_counter()
            reply = client.chat.completions.create(
                model="tiny-target", messages=[{"role": "user", "content": text}], max_tokens=args.output_len,
                temperature=0, extra_body={"ignore_eos": True}, **extra)
            return time.perf_counter() - started, reply

        answers = [ask(t, None)[1].choices[0].message.content for t in texts]
        ratios = []
        for round_ in range(args.rounds):
            kinds = ["none", "right"] if round_ % 2 == 0 else ["right", "none"]
            mean_ms, same, kept = {}, True, 0
            for kind in kinds:
                seconds = []
                for text, answer in zip(texts, answers):
                    took, reply = ask(text, answer if kind == "right" else None)
                    seconds.append(took)
                    same &= reply.choices[0].message.content == answer
                    if kind == "right":
                        kept += reply.usage.completion_tokens_details.accepted_prediction_tokens
                mean_ms[kind] = 1000 * statistics.mean(seconds)
            ratios.append(mean_ms["none"] / mean_ms["right"])
            print(f"round {round_}: none {mean_ms['none']:.0f} ms, with the answer as prediction "
                  f"{mean_ms['right']:.0f} ms ({ratios[-1]:.2f}x faster), {kept} prediction tokens accepted, "
                  f"answers {'the same' if same else 'DIFFERENT'}", flush=True)
        print(f"median {statistics.median(ratios):.2f}x faster with the prediction")


if __name__ == "__main__":
    main()
