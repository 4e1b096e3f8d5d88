"""The messages between an engine's streaming front and its core loop, as typed records.

Commands go front -> core, whether the core is a thread of the front's process
(`AsyncLLMEngine`) or a process of its own (`EngineProcess`); each side has one dispatcher
(`CoreLoop.apply`, `EngineProcess._read`). Across the process boundary they travel pickled,
so a reader or a tool can follow one request by its type from the ingress to the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.config import EngineConfig
from app.guided.output_format import OutputFormat
from app.outputs import RequestOutput
from app.sampling_params import SamplingParams

if TYPE_CHECKING:  # names for the annotations only: the engine's modules import this one
    from outlines_core import Index

    from app.engine.engine_stats import EngineStats
    from app.engine.request_limits import RequestLimits
    from app.engine.spec.draft_channel import DraftChannelAddress
    from app.engine.spec.proposal import DraftInput, Proposal


# -- front -> core: the core loop's commands --------------------------------------------------
@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_format: OutputFormat | None = None  # its index was sent before (`FormatIndex`)


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class FormatIndex:
    """An output format's compiled index, sent once before the format's first request."""
    output_format: OutputFormat
    index: Index


@dataclass(frozen=True)
class DropFormat:
    """The front forgot this format: the core may forget its index too."""
    output_format: OutputFormat


@dataclass(frozen=True)
class ReportCache:
    """Which prefixes does the pool hold? Answered with a `CacheReport` (for the router)."""
    max_blocks: int


@dataclass(frozen=True)
class Stop:
    pass


Command = AddRequest | AbortRequest | FormatIndex | DropFormat | ReportCache | Stop


# -- core -> front, besides the step outputs ----------------------------------------------------
@dataclass(frozen=True)
class CacheReport:
    """The chain hashes of the pool's cached full blocks (app/engine/block_manager.py), the most
    recently published last, and the block size they were computed with."""
    block_size: int
    block_hashes: list[int]


# -- the engine process's own: start-up and draft proposals -----------------------------------
@dataclass(frozen=True)
class StartEngine:
    """Front -> child, first: build the engine; `proposer_in_front`: drafts come from the front."""
    config: EngineConfig
    proposer_in_front: bool


@dataclass(frozen=True)
class EngineReady:
    """Child -> front, once the engine is built."""
    limits: RequestLimits
    stats: EngineStats


@dataclass(frozen=True)
class EngineFailed:
    """Child -> front, instead of `EngineReady`."""
    traceback: str


@dataclass(frozen=True)
class StepOutputs:
    """Child -> front, after every step (and after commands no step followed)."""
    outputs: list[RequestOutput]
    stats: EngineStats


@dataclass(frozen=True)
class ProposeDrafts:
    """Child -> front: the engine wants drafts from the proposer the front holds. Also engine ->
    draft replica, on a draft channel (app/engine/spec/draft_channel.py)."""
    inputs: list[DraftInput]


@dataclass(frozen=True)
class Drafts:
    """The answer to `ProposeDrafts`: proposals, or why there are none."""
    proposals: list[Proposal] | None
    error: str | None = None


@dataclass(frozen=True)
class FindDraftChannel:
    """Child -> front: which draft replica may the engine call directly? (Serve picks one.)"""


@dataclass(frozen=True)
class DraftChannelFound:
    """Front -> child, the answer to `FindDraftChannel`: None when there is no such replica."""
    address: DraftChannelAddress | None
