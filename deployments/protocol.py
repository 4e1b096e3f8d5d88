"""The OpenAI request shapes the ingress reads: the sampling fields every generating request has, and
completions; chat's messages, template fields and tools are in deployments/chat_protocol.py, what the
ingress writes back in deployments/responses.py.

Field names and defaults are OpenAI's, plus vLLM's extras users already send (`top_k`,
`min_p`, `min_tokens`, `ignore_eos`, `stop_token_ids`). Fields are checked for shape here;
what depends on the model (context length, vocabulary) is checked by the ingress
(deployments/engine_requests.py) and the engine.

Output formats: `response_format` (`json_object`, `json_schema`; `{"type": "text"}` is plain
output), vLLM's `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and its newer
`structured_outputs` are checked in shape here; deployments/guided_formats.py turns whichever
one a request uses into the `OutputFormat` the target's engine follows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.sampling_params import GREEDY_BELOW_TEMPERATURE, MIN_REPETITION_PENALTY
from deployments.request_ids import MAX_REQUEST_ID_CHARS

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP = 16  # stop strings per request (each one is checked against every new character)
INT64 = 2 ** 63
# Sampling settings beam search has no use for: refused when a request sets them.
BEAM_SEARCH_CONFLICTS = ("top_p", "top_k", "min_p", "min_tokens", "allowed_token_ids", "bad_words", "seed",
                         "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")


# -- requests -----------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format of type "json_schema" needs a "json_schema" object '
                             'with a "schema"')
        return self

    @property
    def guided(self) -> bool:
        return self.type != "text"


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of json / regex / choice / json_object (grammar refused)."""
    model_config = ConfigDict(populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # `json` shadows BaseModel.json
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    grammar: str | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class PredictedOutput(BaseModel):
    """OpenAI's `prediction`: text most of the output is expected to repeat (a file being edited),
    which speculation drafts from (app/engine/spec/prediction_lookup.py)."""
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class SamplingFields(BaseModel):
    """The fields completions and chat share. Others are kept aside (`ignored_fields`): the
    ingress logs them, as vLLM does, so that a field this server does not read is seen."""
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # None: the one model this app serves
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    min_tokens: int = Field(0, ge=0)  # no stop token or stop string ends the output before this many
    # vLLM's: keep only a prompt's last this many tokens (-1: the context length)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False  # vLLM's: keep the stop string (or own stop token's text)
    skip_special_tokens: bool = True  # vLLM's: false writes special tokens (EOS, template markers) out
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:ID"
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    speculative_decoding: bool = True  # specserve: False opts this request out of speculation
    cache_salt: str | None = Field(None, min_length=1)  # vLLM's: prefix-cache blocks shared only within a salt
    # vLLM's: the response's id is "chatcmpl-" (or "cmpl-") and this (else the X-Request-Id header's).
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    # vLLM's: lower runs first under `scheduling_policy: priority` (anything but 0 is refused
    # under the default "fcfs", as vLLM refuses it).
    priority: int = Field(0, ge=-INT64, lt=INT64)
    logits_processors: list[Any] | None = None  # refused: this server runs no code a request names
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None  # GBNF or Lark (app/guided/), as structured_outputs.grammar
    guided_whitespace_pattern: str | None = None
    structured_outputs: StructuredOutputs | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, ge=MIN_REPETITION_PENALTY)  # vLLM's extra_body spelling
    logit_bias: dict[str, float] | None = None  # token id (as JSON keys are strings) -> bias
    allowed_token_ids: list[int] | None = Field(None, min_length=1)  # vLLM's: only these may be chosen
    bad_words: list[str] | None = None  # vLLM's: never written (deployments/bad_words.py)
    prediction: PredictedOutput | None = None
    # vLLM's extra_body beam search: `beam_width` beams (completions: best_of, else n), the n
    # best returned; length_penalty and early_stopping as transformers defines them.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data):
        """Clients often send `"temperature": null` and the like for "unset"."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @model_validator(mode="after")
    def _check_shared(self) -> "SamplingFields":
        if self.temperature < GREEDY_BELOW_TEMPERATURE:
            self.temperature = 0.0
        stops = self.stop_strings
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop: stop strings must not be empty")
        for token, bias in (self.logit_bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"logit_bias: keys must be token ids, got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias: values must be in [-100, 100], got {bias} for token {token}")
        if any(not word.strip() for word in self.bad_words or ()):
            raise ValueError("bad_words: words must not be empty")
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be positive, or -1 for the context length")
        if self.logits_processors:
            raise ValueError("logits_processors: this server runs no logits processors a request names")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.use_beam_search:
            self._check_beam_search()
        return self

    def _check_beam_search(self) -> None:
        if self.beam_width < 2:
            raise ValueError(f"use_beam_search needs at least 2 beams (best_of, or n); got {self.beam_width}")
        if self.stream:
            raise ValueError("beam search cannot be streamed (the best beams are known at the end)")
        given = [name for name in BEAM_SEARCH_CONFLICTS
                 if name in self.model_fields_set and getattr(self, name) != type(self).model_fields[name].default]
        if self.temperature > 0 and "temperature" in self.model_fields_set:
            given.insert(0, "temperature")
        given += self.beam_search_conflicts()
        if given:
            raise ValueError("beam search ranks beams by the model's own log-probabilities; it does not "
                             f"take {', '.join(given)} (leave them unset)")

    def with_defaults(self, sampling: dict[str, float]) -> "SamplingFields":
        """This request with the sampling fields it leaves unset taken from `sampling` (the
        model's, app/models/generation_config.py). Beam search takes none: it ranks beams by the
        model's own log-probabilities."""
        unset = {name: value for name, value in sampling.items() if name not in self.model_fields_set}
        return self.model_copy(update=unset) if unset and not self.use_beam_search else self

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or ())

    @property
    def max_tokens_given(self) -> bool:
        return bool({"max_tokens", "max_completion_tokens"} & self.model_fields_set)

    @property
    def beam_width(self) -> int:
        return self.n

    def beam_search_conflicts(self) -> list[str]:
        """Fields of this request kind that beam search cannot honour, when given."""
        guided = [name for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                    "structured_outputs")
                  if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.guided:
            guided.insert(0, "response_format")
        return guided

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def token_bias(self) -> dict[int, float] | None:
        return {int(t): b for t, b in self.logit_bias.items()} if self.logit_bias else None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def num_candidates(self) -> int:
        """Engine requests per prompt (completions' `best_of` may ask for more than `n`; one
        beam search runs all its beams)."""
        return 1 if self.use_beam_search else self.n


class CompletionRequest(SamplingFields):
    # A string, a list of strings, a list of token ids, or a list of lists of token ids.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # candidates; the n likeliest are returned
    echo: bool = False  # the prompt before the completion, in the text and the logprobs
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's extra_body field
    suffix: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "CompletionRequest":
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of must be at least n ({self.n}), got {self.best_of}")
        if self.stream and self.num_candidates > self.n:
            raise ValueError("best_of greater than n cannot be streamed (the best are known at the end)")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    @property
    def num_prompt_logprobs(self) -> int | None:
        """The alternatives the engine scores per prompt token: for `echo` with `logprobs`,
        for `prompt_logprobs`, or both; None when neither asks."""
        wanted = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        return max(wanted) if wanted else None

    @property
    def num_candidates(self) -> int:
        return 1 if self.use_beam_search else self.best_of or self.n

    @property
    def beam_width(self) -> int:
        return self.best_of or self.n

    def beam_search_conflicts(self) -> list[str]:
        asked = [name for name in ("logprobs", "prompt_logprobs") if getattr(self, name) is not None]
        return super().beam_search_conflicts() + asked + (["echo"] if self.echo else [])

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request, one per batch entry."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)
