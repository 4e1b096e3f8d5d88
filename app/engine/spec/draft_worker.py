"""The draft model's side of speculation: k proposals for each sequence of a batch.

Stateless per call (each input carries its tokens), but the worker keeps a paged KV pool with
prefix caching, so a sequence seen last step recomputes only its new tokens and the partial
last block; what stays cached is whatever the LRU keeps. All sequences of a call advance
together: one forward for the uncached tails, then k - 1 one-token steps.

Sampled requests draw from the draft's distribution under the request's own temperature and
filters (closer to the target's, so more is accepted), rounded to fp16 exactly as it travels,
with a generator seeded per call from the input, so a seeded request proposes the same drafts
whichever replica answers.
"""

from __future__ import annotations

import torch

from app.config import EngineConfig
from app.engine.block_manager import BlockManager
from app.engine.cuda_graphs import MultiTokenSteps
from app.engine.model_runner import ModelRunner
from app.engine.request import Request
from app.engine.selection.distribution import sampling_probs
from app.engine.spec.proposal import CompactProbs, DraftInput, Proposal
from app.engine.spec.schedule import SpeculationSchedule
from app.models.config import ModelConfig
from app.sampling_params import SamplingParams


def uncached_tails(config: EngineConfig) -> MultiTokenSteps | None:
    """The first forward of a call for sequences seen before: the partial last block (prefix
    caching keeps full blocks only) and the tokens since the last call, the accepted drafts
    and one more. Up to block_size + k tokens, run as a CUDA graph like a verifying step."""
    return SpeculationSchedule.of_engine(config).multi_token_steps(
        config.block_size, config.max_num_seqs, every_row_sampled=False)  # each sequence's last row only


class DraftWorker:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = self.model_config.max_model_len(config.max_model_len)
        self.runner = ModelRunner(config, self.model_config, self.max_model_len, uncached_tails(config))
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, enable_prefix_caching=True)
        self.num_calls = 0
        self.num_computed_tokens = 0  # tokens run through the draft model (cache hits excluded)

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.num_calls += 1
        proposals = [Proposal([]) for _ in inputs]
        active: dict[Request, tuple[int, DraftInput, torch.Generator | None]] = {}
        try:
            for i, inp in enumerate(inputs):
                req = self._admit(i, inp)
                if req is not None:
                    gen = None if inp.greedy else torch.Generator().manual_seed(inp.seed)
                    active[req] = (i, inp, gen)
            rows: dict[int, list[torch.Tensor]] = {i: [] for i, _, _ in active.values()}
            while active:
                batch = {req: req.num_tokens - req.num_computed_tokens for req in active}
                self.num_computed_tokens += sum(batch.values())
                # in the model's dtype: a plain step's graph took the argmax; sampled rows cast their own
                step = self.runner.execute(batch, self.block_manager.tables, fp32_logits=False)
                tokens = self._sample(step.logits, step.argmax, [active[r][1:] for r in batch], rows,
                                      [active[r][0] for r in batch])
                for req, token in zip(list(batch), tokens):
                    req.num_computed_tokens = req.num_tokens
                    self.block_manager.cache_full_blocks(req)
                    i, inp, _ = active[req]
                    proposals[i].token_ids.append(token)
                    if len(proposals[i].token_ids) == inp.k:
                        self.block_manager.free(req)
                        del active[req]
                    else:
                        req.all_token_ids.append(token)
            for i, inp in enumerate(inputs):
                if rows.get(i) and not inp.greedy:
                    proposals[i].probs = CompactProbs.encode(torch.stack(rows[i]))
        finally:
            for req in active:
                self.block_manager.free(req)
        return proposals

    def _admit(self, i: int, inp: DraftInput) -> Request | None:
        """A draft-side request holding KV for the sequence plus k - 1 drafts, or None when it
        cannot be served (too long for the draft model, pool full): no proposal then."""
        if inp.k <= 0 or not inp.token_ids or len(inp.token_ids) + inp.k > self.max_model_len:
            return None
        req = Request(f"draft-{i}", inp.token_ids, SamplingParams(max_tokens=inp.k, ignore_eos=True,
                                                                  cache_salt=inp.cache_salt))
        if self.block_manager.admit(req, lambda _: req.num_tokens + inp.k - 1) is None:
            return None
        return req

    @staticmethod
    def _sample(logits: torch.Tensor, argmax: torch.Tensor | None,
                settings: list[tuple[DraftInput, torch.Generator | None]],
                rows: dict[int, list[torch.Tensor]], indices: list[int]) -> list[int]:
        tokens = (logits.argmax(-1) if argmax is None else argmax).tolist()
        sampled = [j for j, (inp, _) in enumerate(settings) if not inp.greedy]
        if sampled:
            params = [SamplingParams(temperature=settings[j][0].temperature, top_p=settings[j][0].top_p,
                                     top_k=settings[j][0].top_k, min_p=settings[j][0].min_p)
                      for j in sampled]
            # Round to fp16 first and sample from exactly what the target will decode.
            rounded = sampling_probs(logits[sampled].float(), params).half().float()
            travelled = rounded / rounded.sum(-1, keepdim=True)
            for row, j in enumerate(sampled):
                tokens[j] = int(torch.multinomial(travelled[row], 1, generator=settings[j][1]))
                rows[indices[j]].append(rounded[row])
        return tokens
