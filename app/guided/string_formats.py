"""JSON-safe string `format`s and `pattern`s: the schema outlines-core compiles.

outlines-core 0.2.14 writes string formats and patterns between quotes unescaped, and some of
its format patterns are wrong: email's quoted local part (`"a"@b.c`) and address literals put
raw `"`, `\\` and control characters into the JSON string; uri's `[^\\s]` allows them too;
time's fraction is `\\\\.` (a backslash and any character); date allows 02-31; date-time and
time leave out the RFC 3339 offset. It also drops `pattern`/`format` silently when `minLength`
or `maxLength` is present, and `format` when `pattern` is.

`json_safe_schema` returns a copy in which every supported `format` is replaced by a `pattern`
written here (a regex over the string's content, RFC grammar, ASCII), and every `pattern` is
rewritten by `json_text_regex` to match the string's JSON text; combinations outlines-core
would not enforce are refused. What it produces validates with `jsonschema`'s FormatChecker
(with rfc3339-validator, rfc3986-validator and fqdn installed).
"""

from __future__ import annotations

import copy
from typing import Any

from app.guided.errors import GuidedFormatError
from app.guided.json_string import UNSAFE, json_text_regex

_IPV4_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = rf"(?:{_IPV4_OCTET}\.){{3}}{_IPV4_OCTET}"
_H = "[0-9a-f]{1,4}"
IPV6 = ("(?:" + "|".join([
    rf"(?:{_H}:){{7}}{_H}",
    rf"(?:{_H}:){{1,7}}:",
    *(rf"(?:{_H}:){{1,{6 - i}}}(?::{_H}){{1,{i + 1}}}" for i in range(6)),
    rf":(?::{_H}){{1,7}}",
    "::",
]) + ")")
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"  # 0001-9999, as Python's date
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR = r"(?:[01][0-9]|2[0-3])"
TIME = rf"{_HOUR}:[0-5][0-9]:[0-5][0-9](?:\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR}:[0-5][0-9])"
_ATOM = r"[a-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
EMAIL = (rf'(?:{_ATOM}(?:\.{_ATOM})*|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*")'
         rf"@(?:(?:{_LABEL}\.)+{_LABEL}|\[{IPV4}\])")
_PCT = "%[0-9A-F]{2}"
_PCHAR = rf"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
URI = (rf"(?:https?|ftp)://(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
       r"(?:[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}|localhost)(?::[0-9]{1,5})?"
       rf"(?:/{_PCHAR}*)*(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
       rf"|urn:[a-z0-9][a-z0-9-]{{0,31}}:{_PCHAR}+")
_HOST_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,60}[a-z0-9])?"
HOSTNAME = rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,3}}"  # <= 4 labels of <= 62: under 253
FORMATS = {
    "date": DATE,
    "time": TIME,
    "date-time": rf"{DATE}T{TIME}",
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "email": EMAIL,
    "uri": URI,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "hostname": HOSTNAME,
}


def _string_nodes(schema: Any, path: str):
    """Yield (path, node) for every schema object (properties, items, anyOf, $defs, ...)."""
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            yield from _string_nodes(sub, f"{path}/{i}")
        return
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in ("enum", "const", "default", "examples", "required"):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
            if isinstance(value, dict):
                for name, sub in value.items():
                    yield from _string_nodes(sub, f"{path}/{key}/{name}")
        elif isinstance(value, (dict, list)):
            yield from _string_nodes(value, f"{path}/{key}")


def _check_property_names(node: dict, path: str) -> None:
    for name in node.get("properties", {}) if isinstance(node.get("properties"), dict) else ():
        if any(c in UNSAFE for c in name):
            raise GuidedFormatError(f"property name {name!r} at {path} holds a character that "
                                    "JSON must escape (quote, backslash or control); rename it")


def _is_string_schema(node: dict) -> bool:
    kind = node.get("type", "string")  # untyped: outlines-core refuses it later if it must
    return kind == "string" or isinstance(kind, list) and "string" in kind


def content_regex(node: dict, path: str) -> str | None:
    """The regex over a string's content that its `format` or `pattern` asks for (None: neither);
    GuidedFormatError for what cannot be enforced with it."""
    fmt, pattern = node.get("format"), node.get("pattern")
    if fmt is None and pattern is None:
        return None
    what = "pattern" if pattern is not None else f"format {fmt!r}"
    if "minLength" in node or "maxLength" in node:
        raise GuidedFormatError(f"{what} at {path} cannot be enforced together with minLength/"
                                "maxLength; drop one of them")
    if fmt is not None and pattern is not None:
        raise GuidedFormatError(f"format and pattern at {path} cannot be enforced together; "
                                "drop one of them")
    if fmt is not None:
        if fmt not in FORMATS:
            raise GuidedFormatError(f"string format {fmt!r} at {path} is not supported; "
                                    f"supported: {', '.join(FORMATS)}")
        return FORMATS[fmt]
    if not isinstance(pattern, str):
        raise GuidedFormatError(f"pattern at {path} must be a string")
    return pattern


def _rewrite(node: dict, path: str) -> None:
    if not _is_string_schema(node):
        return  # `format: int32` on an integer and the like: only strings take them
    content = content_regex(node, path)
    if content is not None:
        node.pop("format", None)
        node["pattern"] = json_text_regex(content)


def json_safe_schema(schema: dict) -> dict:
    """A copy of `schema` whose string formats and patterns outlines-core turns into regexes
    that only produce JSON strings that parse and validate."""
    schema = copy.deepcopy(schema)
    for path, node in list(_string_nodes(schema, "#")):
        _check_property_names(node, path)
        _rewrite(node, path)
    return schema
