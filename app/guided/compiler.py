"""Output formats -> regex -> outlines-core `Index`, with a time limit and an LRU cache.

Every problem a client can cause (bad schema, unsupported keyword, bad regex, a compile past the
limit) raises `GuidedFormatError`, which the server answers with a 400 (vllm #17248/#17313 were
crashes). Checks outlines-core 0.2.14 does not do itself:
- it silently ignores `patternProperties`, `uniqueItems`, `contains`, `propertyNames`, ... and
  turns a multi-member `allOf` into two objects back to back (not JSON): refused here;
- it ignores `minimum`/`maximum`/`exclusive*`/`multipleOf` (listed by `ignored_keywords`;
  refused with strict=True) and closes objects even with `additionalProperties: true`
  (the output still validates);
- regex lookarounds, backreferences, atomic groups, possessive repeats and anchors inside the
  pattern fail in its DFA builder with an opaque message: named here before compiling.
Patterns are parsed with Python's `re` syntax, so Rust-only syntax (`\\p{L}`) is refused.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from outlines_core import Index, Vocabulary
from outlines_core.json_schema import (BOOLEAN, NULL, NUMBER, STRING, WHITESPACE,
                                       build_regex_from_schema)

from app.guided.ebnf import gbnf_regex, is_gbnf
from app.guided.errors import GuidedFormatError
from app.guided.lark_grammar import lark_regex
from app.guided.nonempty_regex import nonempty_form
from app.guided.regex_check import check_regex
from app.guided.string_formats import json_safe_schema
from app.guided.vocabulary import GuidedVocabulary


# Keywords whose meaning outlines-core drops in a way that lets invalid output through.
UNSUPPORTED_KEYWORDS = ("patternProperties", "not", "if", "then", "else", "contains",
                        "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
                        "unevaluatedProperties", "unevaluatedItems", "minProperties",
                        "maxProperties", "minContains", "maxContains")
IGNORED_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ONE_SCHEMA = ("items", "additionalProperties", "additionalItems", "contains", "not", "if",
               "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")

def _walk_schema(schema: Any, path: str, found: list[tuple[str, str, dict]]) -> None:
    """Collect (keyword, path, node) for each keyword in schema positions (not enum/const values)."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        found.append((key, path, schema))
        if key in _ONE_SCHEMA and isinstance(value, dict):
            _walk_schema(value, f"{path}/{key}", found)
        elif key in _SCHEMA_MAP and isinstance(value, dict):
            for name, sub in value.items():
                _walk_schema(sub, f"{path}/{key}/{name}", found)
        elif key in _SCHEMA_LIST and isinstance(value, list):
            for i, sub in enumerate(value):
                _walk_schema(sub, f"{path}/{key}/{i}", found)


def ignored_keywords(schema: dict) -> list[str]:
    """Keywords outlines-core accepts but does not enforce, as 'keyword at path'."""
    found: list[tuple[str, str, dict]] = []
    _walk_schema(schema, "#", found)
    return [f"{k} at {p}" for k, p, _ in found if k in IGNORED_KEYWORDS]


def check_schema(schema: Any, strict: bool = False) -> None:
    """Raise GuidedFormatError for an invalid schema or one that cannot be enforced."""
    if not isinstance(schema, dict):
        raise GuidedFormatError(f"JSON schema must be an object, got {type(schema).__name__}")
    try:
        from jsonschema.validators import validator_for
    except ImportError:  # jsonschema is optional: outlines-core still rejects the worst
        validator_for = None
    if validator_for is not None:
        from jsonschema.exceptions import SchemaError
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise GuidedFormatError(f"invalid JSON schema at {where}: {e.message}") from None
    found: list[tuple[str, str, dict]] = []
    _walk_schema(schema, "#", found)
    for key, path, node in found:
        if key in UNSUPPORTED_KEYWORDS:
            raise GuidedFormatError(f"unsupported JSON schema keyword '{key}' at {path}")
        if key == "uniqueItems" and node["uniqueItems"] is True:
            raise GuidedFormatError(f"unsupported JSON schema keyword 'uniqueItems' at {path}")
        if key == "allOf" and len(node["allOf"]) > 1:
            raise GuidedFormatError(f"unsupported JSON schema keyword 'allOf' with more than "
                                    f"one member at {path}")
        if strict and key in IGNORED_KEYWORDS:
            raise GuidedFormatError(f"JSON schema keyword '{key}' at {path} is not enforced")


def escape_literal(text: str) -> str:
    """Escape regex metacharacters only (re.escape also escapes spaces, which Rust rejects)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


def json_object_regex(depth: int = 2, whitespace: str = WHITESPACE) -> str:
    """Any JSON object nested at most `depth` levels (a regex cannot count brackets). Depth 2
    (values may be flat objects/arrays) builds its DFA in ~0.2 s; depth 3 takes ~10 s CPU
    whatever the vocabulary (measured, 0.2.14), too slow to build per request."""
    ws = whitespace
    scalar = f"(?:{STRING}|{NUMBER}|{BOOLEAN}|{NULL})"

    def obj(value: str) -> str:
        member = f"{STRING}{ws}:{ws}{value}"
        return rf"\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\}}"

    value = scalar
    for _ in range(depth - 1):
        arr = rf"\[{ws}(?:{value}(?:{ws},{ws}{value})*)?{ws}\]"
        value = f"(?:{scalar}|{obj(value)}|{arr})"
    return obj(value)


def regex_for_format(spec: dict, strict: bool = False, json_object_depth: int = 2) -> str:
    """Turn a response format into the regex its output must fullmatch. JSON whitespace defaults
    to outlines' `[ ]?`: unbounded whitespace lets a model pad forever and forces fewer strings
    for jump-forward; `whitespace_pattern` in the spec overrides it ("" for compact JSON, which
    forces the most text)."""
    if not isinstance(spec, dict):
        raise GuidedFormatError("format must be an object with a 'type'")
    kind = spec.get("type")
    ws = spec.get("whitespace_pattern")
    ws = WHITESPACE if ws is None else "(?:" + check_regex(str(ws)) + ")"  # "": compact JSON
    if kind == "json_schema":
        body = spec.get("json_schema")
        schema = body.get("schema") if isinstance(body, dict) else None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GuidedFormatError(f"JSON schema is not valid JSON: {e}") from None
        if schema is None:
            raise GuidedFormatError("json_schema format needs json_schema.schema")
        check_schema(schema, strict)
        try:
            regex = build_regex_from_schema(json.dumps(json_safe_schema(schema)), ws)
        except (ValueError, TypeError) as e:
            raise GuidedFormatError(f"unsupported JSON schema: {str(e).splitlines()[0]}") from None
        return check_regex(regex)
    if kind == "json_object":
        return json_object_regex(json_object_depth, ws)
    if kind == "regex":
        pattern = spec.get("pattern")
        if not isinstance(pattern, str):
            raise GuidedFormatError("regex format needs a string 'pattern'")
        return check_regex(pattern)
    if kind == "choice":
        choices = spec.get("choices")
        if not choices or not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
            raise GuidedFormatError("choice format needs a non-empty list of strings 'choices'")
        return check_regex("(?:" + "|".join(escape_literal(c) for c in choices) + ")")
    if kind == "grammar":
        grammar = spec.get("grammar")
        if not isinstance(grammar, str):
            raise GuidedFormatError("grammar format needs a string 'grammar'")
        return check_regex(gbnf_regex(grammar) if is_gbnf(grammar) else lark_regex(grammar))
    raise GuidedFormatError(f"unsupported format type {kind!r}; expected json_schema, "
                            "json_object, regex, choice or grammar")


# --- compiling ---------------------------------------------------------------------------------

class CompileTimeout(GuidedFormatError):
    """The compile ran past its limit (the thread finishes in the background)."""


class CompilerBusy(GuidedFormatError):
    """Every compile slot is taken (runaway compiles included); transient, never cached."""


def compile_regex(regex: str, vocab: GuidedVocabulary | Vocabulary) -> Index:
    """Build the token-level automaton (can take milliseconds to many seconds) of every string the
    pattern matches.

    outlines-core 0.2.14 builds a leftmost-first DFA, which drops the alternatives after one that
    has matched (alone, `yes|yes please` never lets "yes please" through), and it refuses a token
    that ends one character past a match unless the token ends another (`(?:ac|[^a])+` cannot
    write "bac" with one token a byte). Anchored at the end, a pattern has no match before the
    end, so neither happens. outlines-core cannot build the start state of a pattern that
    matches the empty string when anchored: see _with_the_empty_string."""
    v = vocab.vocabulary if isinstance(vocab, GuidedVocabulary) else vocab
    body = nonempty_form(regex)
    try:
        if body is None:  # the empty string is all it matches
            return Index(regex, v)
        if body == regex:
            return Index(f"(?:{regex})$", v)
        return _with_the_empty_string(body, v, vocab.token_bytes if isinstance(vocab, GuidedVocabulary) else None)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # ValueError, or a Rust panic (a BaseException): still a 400
        raise GuidedFormatError(f"format cannot be compiled for this vocabulary: {e}") from None


def _with_the_empty_string(nonempty: str, vocab: Vocabulary, token_bytes: list[bytes | None] | None) -> Index:
    """The automaton of a pattern's non-empty strings (`nonempty`, anchored) and of the empty one
    when outlines-core can hold both: `(?:(?:nonempty)$)?` can end at once, but as the empty
    match is the first, every one-byte first token that does not end a match is refused
    (`(?:xa)?` cannot start with "x"). That is let pass where the refused tokens are all bytes
    of longer UTF-8 characters (`.*`, `\\d*`: an output then cannot start with a character the
    vocabulary spells only byte by byte); elsewhere the empty output is the one left out
    (nonempty_regex.py; README: guided decoding). Without `token_bytes` (an outlines-core
    Vocabulary alone) no refused token is let pass."""
    without = Index(f"(?:{nonempty})$", vocab)
    with_empty = Index(f"(?:(?:{nonempty})$)?", vocab)
    refused = (set(without.get_allowed_tokens(without.get_initial_state()))
               - set(with_empty.get_allowed_tokens(with_empty.get_initial_state())))
    if refused and (token_bytes is None or not all(_starts_a_longer_character(token_bytes[t]) for t in refused)):
        return without
    return with_empty


def _starts_a_longer_character(token: bytes | None) -> bool:
    """A one-byte token that is part of a multi-byte UTF-8 character (byte fallback)."""
    return token is not None and len(token) == 1 and token[0] >= 0x80


_slots = threading.BoundedSemaphore(4)  # compiles running at once, runaway ones included


def start_compile(regex: str, vocab: GuidedVocabulary | Vocabulary, wait: float = 5.0) -> Future:
    """Compile on a daemon thread; the future holds the Index or the error. outlines-core
    releases the GIL while compiling (measured), so callers and the event loop keep running;
    an asyncio caller can await `asyncio.wrap_future(start_compile(...))`. A thread cannot be
    killed: a caller that stops waiting at its time limit leaves the compile to finish in the
    background, holding its slot, and drops the result. (A process pool could kill it, but an
    Index has to be pickled back: ~1.4 s + 2.4 s for a 31 MB one, measured, so threads win.)"""
    if not _slots.acquire(timeout=max(wait, 0.0)):
        raise CompilerBusy("too many formats are being compiled; retry later")
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run() -> None:
        try:
            fut.set_result(compile_regex(regex, vocab))
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            fut.set_exception(e)
        finally:
            _slots.release()

    threading.Thread(target=run, name="guided-compile", daemon=True).start()
    return fut


def _timeout_error(seconds: float) -> CompileTimeout:
    return CompileTimeout(f"compiling the format took longer than {seconds:g} s; simplify it "
                          "(e.g. smaller maxLength / maxItems / fewer nested levels)")


def _copy_outcome(source: Future, target: Future) -> None:
    if source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


MAX_UNREAD_COMPILE_TIMES = 1024


class IndexCache:
    """LRU of compiled indexes keyed by (vocab_hash, regex). Concurrent requests for one key share
    one compile. Failures (timeouts included) are remembered, so the same format is refused at
    once instead of starting another long compile; CompilerBusy (no compile slot freed up
    within the time limit) is not remembered."""

    def __init__(self, max_entries: int = 64, max_failures: int = 256):
        self.max_entries, self.max_failures = max_entries, max_failures
        self._items: OrderedDict[tuple[str, str], Index] = OrderedDict()
        self._failures: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._inflight: dict[tuple[str, str], Future] = {}
        self._lock = threading.RLock()  # a done callback can run inside the lock
        self.hits = self.misses = self.compiles = 0
        # How long each compile took, until the metrics take them (bounded, in case none do).
        self._compile_seconds: deque[float] = deque(maxlen=MAX_UNREAD_COMPILE_TIMES)

    def get(self, vocab_hash: str, regex: str) -> Index | None:
        with self._lock:
            index = self._items.get((vocab_hash, regex))
            if index is not None:
                self._items.move_to_end((vocab_hash, regex))
            return index

    def put(self, vocab_hash: str, regex: str, index: Index) -> None:
        with self._lock:
            self._items[(vocab_hash, regex)] = index
            self._items.move_to_end((vocab_hash, regex))
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def _fail(self, key: tuple[str, str], message: str) -> None:
        with self._lock:
            self._failures[key] = message
            while len(self._failures) > self.max_failures:
                self._failures.popitem(last=False)

    def _finish(self, key: tuple[str, str], start: float, fut: Future) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            failed = key in self._failures
        if fut.exception() is None and not failed:
            with self._lock:
                self.compiles += 1
                self._compile_seconds.append(time.perf_counter() - start)
            self.put(*key, fut.result())

    def take_compile_seconds(self) -> list[float]:
        """The compile times since the last call (for the compile-time histogram)."""
        with self._lock:
            times = list(self._compile_seconds)
            self._compile_seconds.clear()
            return times

    def get_or_compile(self, regex: str, vocab: GuidedVocabulary, seconds: float) -> Index:
        key = (vocab.vocab_hash, regex)
        deadline = time.monotonic() + seconds
        with self._lock:
            index = self._items.get(key)
            if index is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return index
            if key in self._failures:
                raise GuidedFormatError(self._failures[key])
            self.misses += 1
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:  # registered at once, so concurrent requests for the key share it
                fut = self._inflight[key] = Future()
                fut.set_running_or_notify_cancel()
        if owner:  # wait for a compile slot outside the lock: cache hits never queue behind it
            try:
                compiling = start_compile(regex, vocab, wait=max(deadline - time.monotonic(), 0.0))
            except CompilerBusy as busy:
                with self._lock:
                    self._inflight.pop(key, None)
                fut.set_exception(busy)
                raise
            start = time.perf_counter()
            fut.add_done_callback(lambda f: self._finish(key, start, f))
            compiling.add_done_callback(lambda f: _copy_outcome(f, fut))
        try:
            return fut.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            err: GuidedFormatError = _timeout_error(seconds)
        except CompilerBusy:
            raise
        except GuidedFormatError as e:
            err = e
        self._fail(key, str(err))
        raise err

    def __len__(self) -> int:
        return len(self._items)
