"""Served, grounded prompts at concurrency 1: the engine's spec counters over the run.

    python benchmarks/results/lookup_first_2026-11-26/probe_spec.py [specserve[:key=value,...]]
"""
import sys, re, urllib.request
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks import serving
from benchmarks.servers import ServerSpec, running

def scrape(url):
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("specserve:spec_decode") or line.startswith("specserve:num_steps") or "prefix" in line and not line.startswith("#"):
            m = re.match(r"(\S+?)(\{.*\})? (\S+)$", line)
            if m and not line.startswith("#"):
                key = m.group(1) + (re.sub(r',?(model_name|replica)="[^"]*"', "", m.group(2) or ""))
                out[key] = out.get(key, 0) + float(m.group(3))
    return out

spec = ServerSpec.parse(sys.argv[1] if len(sys.argv) > 1 else "specserve")
out = ROOT / "benchmarks" / "out"; out.mkdir(exist_ok=True)
with running(spec, 8011, str(ROOT / "checkpoints/tiny-target"), "tiny-target", out / "probe_server.log") as url:
    serving.main(["--base-url", url, "--model", str(ROOT / "checkpoints/tiny-target"), "--served-model-name", "tiny-target",
                  "--num-prompts", "4", "--concurrency", "1", "--dataset", "grounded", "--disable-tqdm", "--output-len", "64"])
    import time; time.sleep(3)
    before = scrape(url)
    r = serving.main(["--base-url", url, "--model", str(ROOT / "checkpoints/tiny-target"), "--served-model-name", "tiny-target",
                  "--num-prompts", "30", "--concurrency", "1", "--dataset", "grounded", "--disable-tqdm", "--output-len", "64", "--seed", "3"])
    time.sleep(3)
    after = scrape(url)
    for k in sorted(after):
        d = after[k] - before.get(k, 0)
        if d:
            print(f"{k:90s} {d:.3f}")
    print("mean e2e", r["levels"][0]["http"].get("mean_e2el_ms"))
