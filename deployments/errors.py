"""Failures of other replicas as the client should see them: what happened and what to do,
without Ray's internals (actor ids, pids, addresses), which go to the ingress's log instead."""

from __future__ import annotations

from ray.exceptions import ActorUnavailableError, RayActorError

from app.outputs import EngineDied

REPLICA_LOST = ("the model replica serving this request stopped before it finished (Serve is "
                "replacing it); retry the request")


def replica_lost(exc: BaseException) -> bool:
    """True when a replica this request depended on died or became unreachable, or its engine
    process did (a Ray task error also subclasses the error it carries)."""
    return isinstance(exc, (RayActorError, ActorUnavailableError, EngineDied))


def remote_cause(exc: BaseException) -> BaseException:
    """The user exception inside a Ray task error (which also subclasses it)."""
    return getattr(exc, "cause", None) or exc
