"""`OutputFormat`: a guided output format in its canonical form, one name from the request to
the mask.

The ingress turns whatever the client asked for (`response_format`, `guided_json`,
`guided_regex`, `guided_choice`, `structured_outputs`, tool calls; deployments/guided_formats.py)
into an `OutputFormat` with `regex_for_format` (app/guided/compiler.py), refusing bad formats
with a 400 there. It rides in the request's params to a TargetModel replica, which gets its
compiled `Index` from the ConstraintService (deployments/guided_client.py) and hands format and
index to its engine, which keeps one `CompiledFormat` per format (app/guided/guide.py) and
starts a `GuidedDecoder` per request from it. Equal formats are equal keys everywhere (the
ConstraintService's cache, the target's store, the engine's table).

A leaf module: nothing but the dataclass, so every stage can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputFormat:
    """The regex the whole output must fullmatch (JSON schemas, choices and tool formats
    included, already converted)."""
    regex: str
