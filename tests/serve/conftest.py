"""One real Serve application per test module, on a small local Ray cluster.

The app serves `checkpoints/tiny-target` (with `tiny-draft`) when the repo has them, and
otherwise a random checkpoint with a small byte-level BPE tokenizer and chat template written
to a temp dir. It listens on a free port (so test runs never collide on 8000).
"""

from __future__ import annotations

import os
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")

from benchmarks import local_serve  # noqa: E402
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eos|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def write_checkpoint_with_tokenizer(path: Path) -> Path:
    """A random Llama-3-style model with a byte-level BPE tokenizer and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.checkpoints import write_random_llama3

    write_random_llama3(path, vocab_size=512)  # eos_token_id=1: "<|eos|>" below
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = Path(socket.__file__).read_text() + "héllo wörld — ünïcödé 日本語 🙂 " * 20
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=480, special_tokens=["<|pad|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>",
                            additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
                            chat_template=CHAT_TEMPLATE).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """(target, draft) checkpoint directories: the shipped pair, or one random checkpoint as
    both (a model can draft for itself: same tokenizer)."""
    if all((d / "config.json").is_file() for d in (DEFAULT_TARGET, DEFAULT_DRAFT)) \
            and (DEFAULT_TARGET / "tokenizer.json").is_file():
        return DEFAULT_TARGET, DEFAULT_DRAFT
    path = write_checkpoint_with_tokenizer(tmp_path_factory.mktemp("ckpt") / "random-llama")
    return path, path


# The ports the kernel hands out (ip_local_port_range, 32768-60999 by default: every outgoing
# connection, and Ray's processes open many while Serve starts) and Ray's worker ports
# (10002-19999) can be taken between picking a port and HAProxy binding it (a CI run,
# 2026-11-26: "cannot bind socket (Address already in use)", one module's 15 tests in error).
# Serve's ports come from between the two.
SERVE_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port free now that none of Ray's processes will pick while Serve starts."""
    for port in random.sample(SERVE_PORTS, 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {SERVE_PORTS.start}-{SERVE_PORTS.stop - 1}")


@dataclass
class ServeApp:
    name: str
    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name
    checkpoint: Path
    args: dict

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def target_handle(self):
        from ray import serve

        return serve.get_deployment_handle("TargetModel", self.name)


def start_ray_serve(num_cpus: int = 4) -> int:
    """Start a small local Ray and Serve on a free port as `serve run serve_config.yaml` would
    (benchmarks/local_serve.py), so that test apps run in the mode users get: a draft call
    that only failed in throughput mode went unnoticed while the tests ran without it.
    Returns the port."""
    import ray
    from ray import serve

    port = free_port()
    env_vars = {**local_serve.app_env_vars(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                # throughput mode buffers 1000 access-log lines; tests read the logs at once
                "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1"}
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     runtime_env={"env_vars": env_vars})
            break
        except Exception:
            # On a heavily loaded machine the raylet can give up waiting 15 s for its agent
            # (ray-project/ray#65983); a second start usually works.
            ray.shutdown()
            if attempt == 2:
                raise
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                controller_options=local_serve.controller_options())
    return port


def wait_for_route(url: str, timeout_s: float = 60.0) -> None:
    """Wait until the HTTP proxy routes `url` to the app. `serve.run` returns once the app is
    RUNNING, but HAProxy learns its targets by long poll afterwards and answers an empty 404
    until then (a CI run, 2026-12-07: a module's first two requests got it)."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url, timeout=10).status_code != 404:  # 401 under an api_key is routed too
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not routed within {timeout_s} s of serve.run")
        time.sleep(0.2)


def deploy_app(name: str, args: dict, port: int) -> ServeApp:
    """`serve.run(build_app(args))` at route "/" of the running Serve; returns a ServeApp."""
    from ray import serve

    from deployments.builder import build_app

    serve.run(build_app(args), name=name, route_prefix="/")
    wait_for_route(f"http://127.0.0.1:{port}/v1/models")
    model = Path(args["model"]).name
    return ServeApp(name, f"http://127.0.0.1:{port}", args.get("served_model_name") or model,
                    Path(args["model"]), args)


def start_serve_app(name: str, args: dict, num_cpus: int = 4):
    """Start Ray (small) and Serve, run `build_app(args)`; returns a ServeApp. Pair with stop_serve_app."""
    return deploy_app(name, args, start_ray_serve(num_cpus))


def stop_serve_app() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def serve_app(request, checkpoints):
    """The module's app; a module may set `SERVE_APP_ARGS` (dict) to add or override args."""
    target, draft = checkpoints
    args = {"model": str(target), "draft_model": str(draft), "device": "cpu", "num_kv_blocks": 256,
            "max_num_seqs": 64}
    args.update(getattr(request.module, "SERVE_APP_ARGS", {}))
    app = start_serve_app(request.module.__name__.rsplit(".", 1)[-1], args)
    try:
        yield app
    finally:
        stop_serve_app()


@pytest.fixture(scope="module")
def client(serve_app):
    import openai

    return openai.OpenAI(base_url=serve_app.base_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(serve_app):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(serve_app.checkpoint)
