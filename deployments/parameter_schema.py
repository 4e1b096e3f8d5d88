"""The parameters schema of a function whose calls write each parameter apart, as XML elements
(deployments/xml_tool_calls.py) or Python keywords (deployments/pythonic_tool_calls.py), not as one
JSON object: it must be one object schema, whose properties are the parameters."""

from __future__ import annotations

from app.guided.compiler import check_schema
from app.guided.errors import GuidedFormatError
from deployments.tool_protocol import FunctionDefinition


def object_parameters(function: FunctionDefinition, written_as: str) -> dict:
    """The function's parameters schema; GuidedFormatError for one that cannot be written so."""
    schema = function.schema_
    check_schema(schema)  # what the JSON calls' compile refuses, refused here too
    if not isinstance(schema, dict) or schema.get("type", "object") != "object" or any(
            k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        raise GuidedFormatError(f"{function.name}: its parameters must be one object schema to be written as "
                                f"{written_as}")
    return schema


def with_definitions(schema, root: dict):
    """A parameter's schema with the parameters schema's definitions, which its `$ref`s point into
    (it is compiled on its own)."""
    if not isinstance(schema, dict):
        return schema
    return {**{k: root[k] for k in ("$defs", "definitions") if k in root}, **schema}


def lists_no_parameters(schema: dict) -> bool:
    """A schema that takes any parameters, naming none (their names and values are free)."""
    return schema.get("properties") is None and schema.get("additionalProperties") is not False
