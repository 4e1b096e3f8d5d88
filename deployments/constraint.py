"""ConstraintService: compiles output formats (JSON schema, regex, choice) into token indexes.

Present in the graph from the start; the guided-decoding issue fills `compile` in. Until then
it refuses every format with `UnsupportedFormat`, which the ingress answers with a 400.
"""

from __future__ import annotations

from ray import serve


class UnsupportedFormat(ValueError):
    """A format this service cannot (yet) compile; the client gets a 400 with this message."""


@serve.deployment(ray_actor_options={"num_cpus": 0})
class ConstraintService:
    async def compile(self, regex_or_format: str | dict) -> bytes:
        kind = regex_or_format.get("type") if isinstance(regex_or_format, dict) else "regex"
        raise UnsupportedFormat(f"guided decoding ({kind}) is not supported yet; "
                                "send the request without response_format")
