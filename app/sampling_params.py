"""Per-request sampling settings, with the names the OpenAI API and vLLM use."""

from __future__ import annotations

from dataclasses import dataclass, field

# Temperatures below this are greedy (vLLM's rule): logits divided by less could overflow fp32,
# and the draw is the argmax in the limit anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5
# Positive logits are divided by the repetition penalty: below this they could overflow fp32.
MIN_REPETITION_PENALTY = 1e-3


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0  # vLLM's: until this many are out, no stop token (EOS included) is chosen
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) means no top-k cut
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; n: the sampled token's logprob plus the top n
    prompt_logprobs: int | None = None  # as `logprobs`, for the prompt's own tokens (vLLM's)
    speculative_decoding: bool = True  # False: never verify draft tokens for this request
    # OpenAI's `prediction`, tokenized: what the output is expected to be mostly, drafted from
    # wherever the output follows it (app/engine/spec/prediction_lookup.py)
    prediction_token_ids: list[int] | None = None
    # vLLM's: under the "priority" scheduling policy, lower runs first (the engine refuses
    # anything but 0 under "fcfs").
    priority: int = 0
    # vLLM's: only requests with the same salt share prefix-cache blocks (tenants cannot learn
    # from a hit what another one sent); None shares with every unsalted request.
    cache_salt: str | None = None
    # Penalties over what was generated so far (OpenAI's; -2..2), and vLLM's repetition penalty
    # over prompt + output (> 0; 1 is none): positive logits divided by it, negative multiplied.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: list[int] | None = None  # vLLM's: only these tokens may be chosen
    # vLLM's `bad_words`, as token sequences: a sequence's last token is barred wherever the
    # output so far ends with the rest of it (a one-token word is barred everywhere).
    bad_words_token_ids: list[list[int]] | None = None
    # Beam search (vLLM's `use_beam_search` with `best_of` beams): 1 is none. The output is the
    # best finished hypotheses by cumulative logprob / generated length ** length_penalty, with
    # transformers' `early_stopping` (True, False or "never").
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        if self.top_k == -1:
            self.top_k = 0
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be between 0 and max_tokens ({self.max_tokens}), "
                             f"got {self.min_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW_TEMPERATURE:
            self.temperature = 0.0
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise ValueError(f"prompt_logprobs must be between 0 and 20, got {self.prompt_logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty >= MIN_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be at least {MIN_REPETITION_PENALTY}, "
                             f"got {self.repetition_penalty}")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must name at least one token")
        if any(not word or min(word) < 0 for word in self.bad_words_token_ids or ()):
            raise ValueError("bad_words: every word must be a non-empty sequence of token ids >= 0")
        if any(t < 0 for t in self.prediction_token_ids or ()):
            raise ValueError("prediction: token ids must be >= 0")
        if any(t < 0 for t in self.allowed_token_ids or ()):
            raise ValueError(f"allowed_token_ids: token ids must be >= 0, got {min(self.allowed_token_ids)}")
        for token_id, bias in (self.logit_bias or {}).items():
            if token_id < 0:
                raise ValueError(f"logit_bias: token ids must be >= 0, got {token_id}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias: biases must be in [-100, 100], got {bias} for token {token_id}")

        if self.cache_salt is not None and not self.cache_salt:
            raise ValueError("cache_salt must be a non-empty string when given")
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f'early_stopping must be true, false or "never", got {self.early_stopping!r}')

    @property
    def beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def penalised(self) -> bool:
        """Some penalty, bias or allowed set changes the logits before selection."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.allowed_token_ids is not None or self.bad_words_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
