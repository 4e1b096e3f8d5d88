"""The HTTP front: OpenAI-compatible completions and chat, SSE streaming, errors, metrics.

Per request: validate (pydantic), check the model name, apply the chat template, tokenize,
check the context length, then start one engine request per choice (`n` of them per prompt)
on a TargetModel replica through a streaming handle. Each item the target yields is one
engine step's new tokens for that request; the ingress detokenizes it incrementally (whole
characters only, stop strings cut exactly) and writes it out, so every chunk crosses one
deployment boundary.

The first output of every choice is awaited before the response starts, so a request the
engine refuses gets a 400, not a broken stream. A client that goes away (or a stop string)
cancels the target-side generator, which aborts the engine request and frees its KV blocks.
"""

# No `from __future__ import annotations` here: FastAPI must see real classes (the request bodies) in
# the signatures of the routes that Serve rewraps.
import asyncio
import dataclasses
import importlib.metadata
import logging
import time
from typing import Callable, Literal

from fastapi import Query, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from transformers import AutoTokenizer

from app.engine.request import stop_token_ids
from app.guided.compiler import CompilerBusy
from app.guided.errors import GuidedFormatError
from app.guided.output_format import OutputFormat
from app.models.generation_config import GenerationDefaults
from app.outputs import EngineOverloaded
from deployments.chat_prompt import chat_prompt_ids
from deployments.chat_protocol import ChatCompletionRequest
from deployments.chat_route import ChatRoutes
from deployments.completion_route import CompletionRoutes
from deployments.choices import Choice, guarded_stream, usage_of
from deployments.detokenizer import IncrementalDetokenizer
from deployments.engine_requests import engine_requests
from deployments.bad_words import bad_words_token_ids
from deployments.beam_choices import beam_texts
from deployments.output_logprobs import token_id_text
from deployments.errors import remote_cause
from deployments.http_app import app
from deployments.harmony import reply_end_ids
from deployments.guided_formats import FormatRequestError, RequestedFormat, requested_format
from deployments.request_gate import DEFAULT_MAX_BODY_BYTES, GateSettings
from deployments.metrics import IngressMetrics
from deployments.prefix_router import RoutingCollector
from deployments.markup_tokens import skipped_special_ids
from deployments.tool_calls import PLAIN, ToolCallSyntax, requested_tool_format, template_knows_tools
from deployments.tokenize_protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest,
                                           TokenizeCompletionRequest, TokenizeResponse)
from deployments.openai_errors import OpenAIError, error_message
from deployments.protocol import CompletionRequest
from deployments.request_ids import client_request_id, response_ids
from deployments.responses_api_protocol import ResponseObject, ResponsesRequest
from deployments.response_items import MAX_LIST_LIMIT
from deployments.responses_route import ResponsesRoutes
from deployments.responses import ChatChoice, ChatCompletionResponse, ModelCard, ModelList, UsageInfo

logger = logging.getLogger("ray.serve")


def _installed_version() -> str:
    try:
        return importlib.metadata.version("specserve")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was not installed
        return "0+unknown"


SPECSERVE_VERSION = _installed_version()


# -- the deployment -----------------------------------------------------------------------
@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0.5})
@serve.ingress(app)
class Ingress(CompletionRoutes, ChatRoutes, ResponsesRoutes):
    def __init__(self, target, metrics_hub, model_path: str, served_model_name: str,
                 max_model_len: int, vocab_size: int, api_keys: list[str] | None = None,
                 max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 defaults: GenerationDefaults = GenerationDefaults(), eos_token_ids: tuple[int, ...] = (),
                 priority_scheduling: bool = False, reasoning_parser: str | None = None,
                 response_store=None, max_stored_responses: int = 0, tool_syntax: ToolCallSyntax = PLAIN,
                 markup_tokens: tuple[str, ...] = ()):
        self.target = target
        # deployments/response_store.py; None when the app keeps no responses
        self.response_store = response_store if max_stored_responses else None
        self.background_runs: set[asyncio.Task] = set()  # the Responses API's background responses
        self.priority_scheduling = priority_scheduling  # the engines' `scheduling_policy` is "priority"
        self.reasoning_parser = reasoning_parser  # deployments/reasoning.py
        self.model_path = model_path
        self.model_name = served_model_name
        app.state.gate = GateSettings.of(api_keys, max_request_body_bytes)  # read by RequestGate
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        template = getattr(self.tokenizer, "chat_template", None)
        template = template if isinstance(template, str) else None
        self.tool_syntax = tool_syntax  # the builder's: the app's tool_call_parser, else the template's
        self.skipped_special_ids = skipped_special_ids(self.tokenizer, markup_tokens)  # all but the markup's
        self.reply_end_ids = reply_end_ids(self.tokenizer) if tool_syntax.harmony else ()
        self.native_tools = template_knows_tools(template)
        self.metrics = IngressMetrics(metrics_hub, served_model_name)
        self.metrics.registry.register(RoutingCollector(served_model_name, self.metrics.replica))
        self.max_model_len = max_model_len  # resolved once, by the builder
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids  # the model's: app/models/config.py, ModelConfig.from_dir
        self.defaults = defaults  # what fills the sampling fields a request leaves unset
        if defaults.sampling or defaults.max_tokens is not None:
            logger.info("Requests that leave them unset take the model's generation_config.json "
                        "settings: %s", {**defaults.sampling, "max_tokens": defaults.max_tokens})
        self._token_text: dict[int, str] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise OpenAIError(404, f"The model `{model}` does not exist; this server serves "
                                   f"`{self.model_name}`.", param="model", code="model_not_found")

    def _token_names(self, body) -> Callable[[int], str]:
        """How a request's logprobs name tokens: by their text, or as "token_id:ID" with vLLM's
        `return_tokens_as_token_ids` (for callers that need ids, where texts can collide)."""
        return token_id_text if body.return_tokens_as_token_ids else self._token_str

    def _token_str(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    async def _guide(self, req, tools: RequestedFormat | None = None, thinking: bool = False
                     ) -> tuple[OutputFormat | None, str | None]:
        """(the `OutputFormat` the output must follow, the request field it came from) when the
        request asks for an output format or tool calls, else (None, None). A format that cannot
        become one (bad schema, bad regex, ...) is a 400 here; the target gets the format's index
        from the ConstraintService (deployments/guided_client.py), and a regex that cannot be
        compiled there is refused when its streams start (`_start`)."""
        try:
            requested = requested_format(req)
        except FormatRequestError as exc:
            raise OpenAIError(400, str(exc), param=exc.param) from None
        if tools is not None and requested is not None:
            raise OpenAIError(400, f"{requested.param} cannot be combined with tool calls; set "
                                   "tool_choice to \"none\" or drop it", param=requested.param)
        requested = requested or tools
        if requested is None:
            return None, None
        try:  # JSON schema to regex: in a thread, so that a huge schema does not hold the loop
            around = self._guided_whole(requested is tools, thinking)
            return await asyncio.to_thread(requested.output_format, around), requested.param
        except GuidedFormatError as exc:
            raise OpenAIError(400, str(exc), param=requested.param) from None

    async def _start(self, engine_ids: str, prompts: list[list[int]], req, max_tokens: int | None,
                     logprobs: int | None, prompt_param: str,
                     tools: RequestedFormat | None = None,
                     prompt_logprobs: int | None = None, thinking: bool = False) -> list[Choice]:
        """Check every prompt, then start n engine requests per prompt and await their first outputs.
        `thinking`: the outputs start with reasoning, which an output format leaves free."""
        if req.ignored_fields:
            logger.warning("%s: this server does not read the fields %s; they were ignored", engine_ids,
                           ", ".join(req.ignored_fields))
        req = req.with_defaults(self.defaults.sampling)
        if req.priority and not self.priority_scheduling:
            raise OpenAIError(400, f"priority {req.priority} needs `scheduling_policy: priority`; this server "
                                   "serves requests first come, first served (priority 0)", param="priority")
        bad_words = bad_words_token_ids(self.tokenizer, req.bad_words) if req.bad_words else None
        predicted = req.prediction.text() if req.prediction is not None else ""
        prediction = self.tokenizer.encode(predicted, add_special_tokens=False) if predicted else None
        started = engine_requests(req, prompts, max_tokens, logprobs, prompt_logprobs, prompt_param,
                                  self.max_model_len, self.vocab_size, self.defaults, bad_words, self.reply_end_ids,
                                  prediction)
        output_format, format_param = await self._guide(req, tools, thinking)
        guided = {} if output_format is None else {"output_format": output_format}

        choices: list[Choice] = []
        handle = self.target.options(stream=True)
        for r in started:
            stream = handle.generate.remote(f"{engine_ids}-{r.index}", r.prompt_ids,
                                            {**dataclasses.asdict(r.params), **guided})
            detok = IncrementalDetokenizer(self.tokenizer, r.prompt_ids, req.stop_strings, req.skip_special_tokens,
                                           req.min_tokens, req.include_stop_str_in_output,
                                           stop_token_ids(r.params, self.eos_token_ids), self.skipped_special_ids)
            choices.append(Choice(r.index, r.prompt_index, r.prompt_ids, stream, detok,
                                  self.metrics.start_request(len(r.prompt_ids)), predicted=prediction is not None))
        try:
            await asyncio.gather(*(c.start() for c in choices))
        except BaseException as exc:
            refused = isinstance(exc, (ValueError, EngineOverloaded))  # nothing ran: no metrics
            for c in choices:
                c.close(record=not refused)
            if isinstance(exc, EngineOverloaded):
                raise OpenAIError(429, error_message(exc), "rate_limit_error", code="engine_overloaded") from None
            if isinstance(remote_cause(exc), CompilerBusy):  # transient and not the request's fault
                raise OpenAIError(503, error_message(exc), "service_unavailable_error") from None
            if isinstance(remote_cause(exc), GuidedFormatError):  # the ConstraintService refused it
                raise OpenAIError(400, error_message(exc), param=format_param) from None
            if refused:
                raise OpenAIError(400, error_message(exc), param=prompt_param) from None
            raise
        return choices

    @staticmethod
    def _chunk_usage(body, choices: list[Choice], indices) -> UsageInfo | None:
        """vLLM's `continuous_usage_stats`: the usage so far of the choices a chunk carries."""
        if not body.continuous_usage:
            return None
        return usage_of([c for c in choices if c.index in indices])

    def _chat_prompt(self, body) -> list[int]:
        return chat_prompt_ids(self.tokenizer, body, self.tool_syntax, self.native_tools)

    # -- routes -------------------------------------------------------------------------------
    @app.get("/health")
    async def health(self) -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        return Response(await self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping(self) -> Response:
        """vLLM's (and SageMaker's) health check."""
        return Response(status_code=200)

    @app.get("/version")
    async def version(self) -> dict:
        return {"version": SPECSERVE_VERSION}

    @app.get("/v1/models")
    async def models(self) -> ModelList:
        return ModelList(data=[self._model_card()])

    @app.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str) -> ModelCard:
        """OpenAI's `client.models.retrieve` (a model id may hold slashes)."""
        self._check_model(model_id)
        return self._model_card()

    def _model_card(self) -> ModelCard:
        return ModelCard(id=self.model_name, root=self.model_path, max_model_len=self.max_model_len)

    @app.post("/tokenize")
    async def tokenize(self, body: TokenizeChatRequest | TokenizeCompletionRequest) -> TokenizeResponse:
        """vLLM's /tokenize: a prompt, or chat messages rendered as /v1/chat/completions does."""
        self._check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            ids = self._chat_prompt(body)
        else:
            ids = self.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.max_model_len, tokens=ids,
                                token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self._check_model(body.model)
        size = len(self.tokenizer)
        bad = [t for t in body.tokens if not 0 <= t < size]
        if bad:
            raise OpenAIError(400, f"token ids must be in [0, {size}); got {bad[:5]}", param="tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(body.tokens))

    @app.post("/v1/completions")
    async def completions(self, body: CompletionRequest, raw: Request):
        self._check_model(body.model)
        prompts = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in body.prompts()]
        request_id, engine_ids = response_ids("cmpl", client_request_id(raw, body.request_id))
        ranked = body.num_candidates > body.n  # best_of: each token's logprob ranks the candidates
        logprobs = body.logprobs if body.logprobs is not None or not ranked else 0
        choices = await self._start(engine_ids, prompts, body, body.max_tokens, logprobs, "prompt",
                                    prompt_logprobs=body.num_prompt_logprobs)
        return await self._completion_reply(request_id, int(time.time()), body, choices, ranked)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, raw: Request):
        self._check_model(body.model)
        try:
            tools = requested_tool_format(body, self.tool_syntax)
        except FormatRequestError as exc:
            raise OpenAIError(400, str(exc), param=exc.param) from None
        prompt_ids = self._chat_prompt(body)
        request_id, engine_ids = response_ids("chatcmpl", client_request_id(raw, body.request_id))
        thinking = self._thinks(body)
        choices = await self._start(engine_ids, [prompt_ids], body, body.max_new_tokens,
                                    body.num_logprobs, "messages", tools, thinking=thinking)
        created = int(time.time())
        if body.use_beam_search:
            beams = beam_texts(choices, body.n)
            splits = [self._reasoning_stream(thinking) for _ in beams]
            return ChatCompletionResponse(
                id=request_id, created=created, model=self.model_name,
                choices=[ChatChoice(index=b.index, message=self._chat_message(body, *s.take(b.text, True, b.token_ids),
                                                                              thinking),
                                    finish_reason=b.finish_reason, stop_reason=b.stop_reason)
                         for b, s in zip(beams, splits)],
                usage=self._with_reasoning(usage_of(choices), splits))
        calls_possible = tools is not None
        if body.stream:
            return StreamingResponse(guarded_stream(request_id, choices, self._stream_chat(
                request_id, created, body, choices, calls_possible, thinking)), media_type="text/event-stream")
        return await self._whole_chat(request_id, created, body, choices, calls_possible, thinking)

    @app.post("/v1/responses")
    async def create_response(self, body: ResponsesRequest, raw: Request):
        """OpenAI's Responses API (deployments/responses_route.py)."""
        return await self._create_response(body, client_request_id(raw, body.request_id))

    @app.get("/v1/responses/{response_id}", response_model=ResponseObject)
    async def get_response(self, response_id: str, stream: bool = False, starting_after: int = Query(-1, ge=-1)):
        """A kept response; `stream`: a streamed background one's events, again (deployments/responses_background.py)."""
        if stream:
            return await self._stream_kept(response_id, starting_after)
        return (await self._stored(response_id)).response

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(self, response_id: str, after: str | None = None,
                               limit: int = Query(20, ge=1, le=MAX_LIST_LIMIT),
                               order: Literal["asc", "desc"] = "desc") -> dict:
        """The items the response answered (deployments/response_items.py), paged as OpenAI's."""
        return await self._input_items(response_id, after, limit, order)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(self, response_id: str) -> ResponseObject:
        """End a background response that still runs (deployments/responses_background.py)."""
        return await self._cancel(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(self, response_id: str) -> dict:
        await self._delete_stored(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    def __del__(self):
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.stop()
