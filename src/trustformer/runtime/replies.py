"""What a client sent, validated: a reply must be a metrics record of numbers naming the client this node is and the
round (:func:`validate_reply`), a payload the names, shapes and dtypes the configuration gives
(:func:`check_spec`); a client that fails is dropped from the round with a ``dropped`` event (:func:`drop`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import torch
from flwr.app import Message, MetricRecord

from ..core.shared import ALL_SHARDS
from ..errors import TrustformerError
from ..recording.recorder import RunRecorder
from ..wire import FederationError, PayloadError, TensorSpec, spec_of

log = logging.getLogger(__name__)

# metrics keys the server writes itself: a client's reply may not set them
SERVER_KEYS = frozenset(
    {
        "event",
        "node",
        "reason",
        "bytes_up",
        "bytes_down",
        "exchanged",
        "sampled",
        "epsilon",
        "beta",
        "pilot",
        "goodness",
        "position",
    }
)


class ReplyError(TrustformerError, ValueError):
    """A client's reply is malformed: it is dropped from the round, the run goes on."""


def client_of(metrics, node: int, clients: Mapping[int, int], expected: int) -> int:
    """The client id a reply names, which must be a valid one and the one this node is known as."""
    client = metrics.get("client") if hasattr(metrics, "get") else None
    if isinstance(client, bool) or not isinstance(client, int):
        raise ReplyError(f"'client' must be an integer, got {client!r}")
    if not (0 <= client < expected or client == ALL_SHARDS):
        raise ReplyError(f"'client' = {client} is not a client of this run")
    if clients.get(node, client) != client:
        raise ReplyError(f"node {node} is client {clients[node]} but its reply says client {client}")
    return client


def validate_reply(
    reply: Message, rnd: int, node: int, clients: Mapping[int, int], step: str, *, expected: int, max_examples: int
) -> tuple[int, dict[str, float | int]]:
    """The client id and metrics of a ``train``, ``train.payload`` or ``train.apply`` reply, or a ReplyError
    saying what is wrong: a ``metrics`` MetricRecord of scalar numbers, the client this node is, the round of
    the message, and for ``train`` a ``num_examples`` that is an integer in [1, ``federation.max_examples``]."""
    if "metrics" not in reply.content:
        raise ReplyError(f"the reply to {step} has no 'metrics' record")
    record = reply.content["metrics"]
    if not isinstance(record, MetricRecord):
        raise ReplyError(
            f"the 'metrics' record of the reply to {step} is a {type(record).__name__}, not a MetricRecord"
        )
    metrics = dict(record)
    client = client_of(metrics, node, clients, expected)
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReplyError(f"metric {key!r} must be a number, got {type(value).__name__}")
        if key in SERVER_KEYS:
            raise ReplyError(f"metric {key!r} is the server's to write")
    if metrics.get("round") != rnd:
        raise ReplyError(f"the reply is for round {metrics.get('round')!r}, not round {rnd} (replayed or stale)")
    if step in ("train", "payload"):
        n = metrics.get("num_examples")
        if not isinstance(n, int) or not 1 <= n <= max_examples:
            raise ReplyError(
                f"num_examples = {n!r} must be an integer in [1, {max_examples}] (federation.max_examples)"
            )
    return client, cast("dict[str, float | int]", metrics)  # every value was checked to be a number above


def check_spec(payload: Mapping[str, torch.Tensor], expected: TensorSpec) -> None:
    got = spec_of(dict(payload))
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        extra = sorted(set(got) - set(expected))[:3]
        wrong = [
            f"{n} {got[n][0]} {got[n][1]} (expected {expected[n][0]} {expected[n][1]})"
            for n in sorted(set(got) & set(expected))
            if got[n] != expected[n]
        ][:3]
        raise PayloadError(
            "payload names/shapes/dtypes differ from those the configuration gives: "
            + "; ".join(
                x
                for x in (
                    f"missing {missing}" if missing else "",
                    f"unexpected {extra}" if extra else "",
                    f"wrong {wrong}" if wrong else "",
                )
                if x
            )
        )


def describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, (PayloadError, ReplyError)) else f"{type(exc).__name__}: {text}"


def drop(recorder: RunRecorder, rnd: int, node: int, clients: Mapping[int, int], reason: str) -> None:
    who = clients.get(node, f"node {node}")
    log.warning("round %d: client %s dropped from the round: %s", rnd, who, reason)
    recorder.event(event="dropped", round=rnd, client=clients.get(node), node=node, reason=reason)


def require(valid: int, needed: int, rnd: int, step: str) -> None:
    if valid < needed:
        raise FederationError(
            f"round {rnd} ({step}): only {valid} client(s) replied with a valid message, "
            f"{needed} required (federation.min_clients); see the dropped events in metrics.jsonl"
        )


__all__ = ["SERVER_KEYS", "ReplyError", "check_spec", "client_of", "describe", "drop", "require", "validate_reply"]
