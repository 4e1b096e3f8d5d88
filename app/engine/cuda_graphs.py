"""CUDA graphs for decode steps, plain and verifying: at small batches a decode step is mostly
kernel-launch overhead (hundreds of launches for a 32-layer model), which one graph replay
removes. A verifying step (1 + k query tokens per sequence) run eagerly cost about six plain
steps of the tiny pair on an H100, so drafts could never pay there (RESULTS.md, 2026-11-26).

The model runner (`ModelRunner.execute`) builds one at start-up on CUDA, which captures every
shape then, and replays it for each step `can_run` accepts; other steps run the model eagerly.
A replay gives the final hidden states and the logits of every token row in the model's dtype
(the lm_head is in the graph too): in a decode step every row is sampled, save a short prompt
chunk now and then, for which the runner takes the hidden states instead. A draft's tails are
the exception: only each sequence's last row is sampled, and the runner computes those rows'
logits from the hidden states, so their graphs leave the lm_head out (it would be a second
pass over the lm_head's weights, for nothing).

The graph also reads the step's inputs and makes its choice: one copy brings every input
array in (`StaticStepInputs`), the rows whose tokens the step in flight chose read them where
they are on the device (overlapped scheduling), each row's argmax is taken with its logits,
and in a plain decode step each sequence's token is chosen, its argmax or a draw with the
settings and uniforms the host sent (`GraphDraws`; temperature 0 draws nothing). The step's
tokens then go to the host as they are (`Selector.on_device`). Steps a graph cannot choose for
(drafts to verify, grammar masks, penalties, logprobs, a top-k cut) are chosen eagerly after
the replay, on its logits and argmax.

Shapes: padded sequence counts (1, 2, 4, 8, then every 16 up to the max) times a query length,
over static input buffers (`StaticStepInputs`). Plain decode steps (one query token per
sequence) are captured up to `max_num_seqs`. Steps of several query tokens per sequence are
captured at one query length for the batch sizes the speculation schedule drafts at
(`MultiTokenSteps`): a target's verifying steps (1 + the largest k), a draft model's uncached
tails. A step with fewer tokens per sequence (fewer drafts, a prompt chunk that short) replays
the same graph with its rows at the front and padding behind.

Attention: the prefill kernel, which verifying steps use, sizes its grid by sequences and query
length alone. The decode kernel's grid follows the longest context, which a graph cannot read
from the step, so it is sized while capturing (`static_decode`) for a *reach*: every plain size
is captured at each of the backend's reaches (`graph_reaches`): the longest context and, when
that needs more than one attention partition, one partition (the backend's `partition_size`:
one program per sequence and KV head, no merge kernel); with a program per split, also a short
reach, so that few programs only exit. Whatever the reach, the numbers are the long grid's
(`specserve_kernels.decode_attention`). A graph's
block-table rows are as wide as its reach needs; the longest reach has `max_blocks_per_seq`
columns: a sequence of exactly max_model_len tokens needs ceil(max_model_len / block_size) of
them, hence the +1 margin the runner gives.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.engine.selection.argmax import argmax_and_choose
from app.engine.selection.draw import draw_with_uniforms
from app.engine.static_step_inputs import StaticStepInputs
from app.engine.step_inputs import DeviceInputs, GraphDraws, StepArrays

logger = logging.getLogger(__name__)


def capture_sizes(max_batch_size: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return sizes + [max_batch_size]


@dataclass(frozen=True)
class MultiTokenSteps:
    """Steps of up to `max_seqs` sequences with up to `query_len` query tokens each, captured
    beside the plain decode steps. `every_row_sampled`: the graph computes every row's logits
    (verification); otherwise the hidden states only (a draft's tails)."""
    query_len: int
    max_seqs: int
    every_row_sampled: bool = True


@dataclass
class Replayed:
    """A replay's outputs for the step's T token rows: views of the graphs' shared buffers,
    overwritten by the next replay (which the stream orders after every kernel already launched
    that reads them)."""
    hidden: torch.Tensor  # [T, hidden]
    logits: torch.Tensor | None  # [T, vocab] in the model's dtype; None for a draft's tails
    argmax: torch.Tensor | None  # [T] int64: each row's greedy token, with the logits
    chosen: torch.Tensor | None = None  # [n] int64: each sequence's token, when given draws


class CapturedStep:
    def __init__(self, graph: torch.cuda.CUDAGraph, hidden: torch.Tensor):
        self.graph, self.hidden = graph, hidden

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.hidden


class EagerStep:
    """A captured step where there is no CUDA (this module's CPU tests): each replay runs the
    step's forward again over the same static buffers, as the graph's kernels would."""

    def __init__(self, forward: Callable[[], torch.Tensor]):
        self.replay = forward


class CudaGraphDecodeRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], backend,
                 max_batch_size: int, max_blocks_per_seq: int, device: torch.device | str,
                 multi_token: MultiTokenSteps | None = None):
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_blocks_per_seq * kv_caches[0].shape[2]
        self.sizes = capture_sizes(max_batch_size)
        several = multi_token is not None and multi_token.query_len > 1 and multi_token.max_seqs > 0
        self.multi_token_len = multi_token.query_len if several else 1
        self.multi_token_sizes = capture_sizes(min(multi_token.max_seqs, max_batch_size)) if several else []
        self.multi_token_logits = several and multi_token.every_row_sampled
        max_tokens = max([max_batch_size] + [s * self.multi_token_len for s in self.multi_token_sizes])
        max_logits_rows = max_tokens if self.multi_token_logits else max_batch_size
        self.inputs = StaticStepInputs(max_batch_size, max_tokens, max_blocks_per_seq, kv_caches[0].shape[2],
                                       self.device)
        # One logits buffer for every graph ([256, 128k] bf16 is 66 MB; a graph's own output
        # per shape would hold over 1 GB).
        lm_head = model.lm_head.weight
        self.logits = torch.empty(max_logits_rows, lm_head.shape[0], dtype=lm_head.dtype, device=self.device)
        self.argmax = torch.zeros(max_logits_rows, dtype=torch.long, device=self.device)
        # A plain step's tokens, chosen in the graph; a replay first reads its in-flight input
        # tokens from here (the step before's, or its final tokens copied in when selection
        # ran outside the graph).
        self.chosen = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        graph_reaches = getattr(backend, "graph_reaches", None)  # where its decode grid follows the context
        self.reaches = graph_reaches(self.max_seq_len) if graph_reaches else [self.max_seq_len]  # ascending
        # Keyed by (reach, padded sequences, query length); each graph's final hidden states
        # are its own output.
        self.graphs: dict[tuple[int, int, int], CapturedStep | EagerStep] = {}
        started = time.perf_counter()
        self._capture()
        self.capture_s = time.perf_counter() - started  # start-up cost, printed by decode.py
        logger.info("captured %d CUDA graphs (%d plain sizes x reaches %s, %d sizes of %d query "
                    "tokens) in %.1f s", len(self.graphs), len(self.sizes), self.reaches,
                    len(self.multi_token_sizes), self.multi_token_len, self.capture_s)

    def _forward(self, seqs: int, query_len: int, reach: int) -> torch.Tensor:
        """The final hidden states; the logits and their argmax, where the shape has them, and a
        plain step's chosen tokens go to the shared buffers."""
        tokens, inputs = seqs * query_len, self.inputs
        hidden = self.model(inputs.token_ids(tokens, self.chosen), inputs.positions[:tokens],
                            self.kv_caches, inputs.meta(seqs, query_len, reach), self.backend)
        if self._has_logits(query_len):
            logits, argmax = self.logits[:tokens], self.argmax[:tokens]
            self.model.compute_logits(hidden, fp32=False, out=logits)
            if query_len == 1:
                temperature = inputs.temperature[:seqs]
                drawn = draw_with_uniforms(logits, temperature, None, inputs.top_p[:seqs], inputs.min_p[:seqs],
                                           0, inputs.uniforms[:seqs])
                argmax_and_choose(logits, argmax, temperature, drawn, self.chosen[:seqs])
            else:
                argmax_and_choose(logits, argmax)
        return hidden

    def _has_logits(self, query_len: int) -> bool:
        return query_len == 1 or self.multi_token_logits

    @torch.inference_mode()
    def _capture(self) -> None:
        shapes = [(reach, seqs, 1) for reach in reversed(self.reaches) for seqs in reversed(self.sizes)]
        # The prefill kernel's grid does not follow the context: one reach serves every step.
        shapes += [(self.max_seq_len, seqs, self.multi_token_len) for seqs in reversed(self.multi_token_sizes)]
        if self.device.type != "cuda":
            for shape in shapes:
                self.graphs[shape] = EagerStep(functools.partial(self._forward_at_reach, *shape))
            return
        pool = None
        for reach, seqs, query_len in shapes:  # the largest first; the others reuse its pool
            with self.backend.static_decode(reach):
                self._forward(seqs, query_len, reach)  # warm-up compiles the kernels; all rows are padding
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._forward(seqs, query_len, reach)
            pool = graph.pool() if pool is None else pool
            self.graphs[reach, seqs, query_len] = CapturedStep(graph, hidden)
        torch.cuda.synchronize(self.device)

    def _forward_at_reach(self, reach: int, seqs: int, query_len: int) -> torch.Tensor:
        with self.backend.static_decode(reach):
            return self._forward(seqs, query_len, reach)

    def can_run(self, step: StepArrays) -> bool:
        n, query_len = step.num_seqs, step.max_query_len
        if not (n > 0 and step.block_tables.shape[1] <= self.max_blocks_per_seq
                and step.max_seq_len <= self.max_seq_len):
            return False
        if query_len == 1:
            return n <= self.max_batch_size
        return bool(self.multi_token_sizes) and query_len <= self.multi_token_len and n <= self.multi_token_sizes[-1]

    @torch.inference_mode()
    def run(self, step: StepArrays, device_inputs: DeviceInputs | None = None,
            draws: GraphDraws | None = None) -> Replayed:
        """Replay the step's graph: its inputs in one copy, the in-flight rows' tokens read on
        the device, and for a plain step given `draws`, its tokens chosen."""
        n = step.num_seqs
        if step.max_query_len == 1:
            seqs, query_len = next(s for s in self.sizes if s >= n), 1
            reach = next(r for r in self.reaches if r >= step.max_seq_len)
        else:
            seqs, query_len = next(s for s in self.multi_token_sizes if s >= n), self.multi_token_len
            reach = self.max_seq_len
        if device_inputs is not None and device_inputs.source.data_ptr() != self.chosen.data_ptr():
            source = device_inputs.source  # chosen outside the graph (a draw, a verification)
            self.chosen[:len(source)].copy_(source)
        draws = draws if query_len == 1 else None
        self.inputs.load(step, device_inputs, draws, seqs, query_len, reach)
        hidden = self.graphs[reach, seqs, query_len].replay()
        tokens = step.num_tokens
        if not self._has_logits(query_len):
            return Replayed(hidden[:tokens], None, None)
        return Replayed(hidden[:tokens], self.logits[:tokens], self.argmax[:tokens],
                        self.chosen[:n] if draws is not None else None)
