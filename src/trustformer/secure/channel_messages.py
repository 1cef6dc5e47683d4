"""The messages of the secure channel (module docstring of ``channel.py``): a ``train`` request given its routed
shares (secagg) and a model or aggregate sealed (tee) on the way out; a ``train``/``train.payload`` reply opened,
its sealed metrics checked and merged, and its masked vector kept (secagg) on the way in, with the bytes the secure
forms cost beyond the plain ones."""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..wire import APPLY, TRAIN, TensorSpec, from_array_record, payload_bytes, spec_of
from . import codec, records
from .records import CLEAR_METRICS, MODEL_KIND, SEALED_METRICS, SECURE
from .sealing import SealError


def outgoing(link: Any, node: int, message_type: str, rnd: int, content: RecordDict) -> RecordDict:
    """The content of one message to ``node`` in its secure form."""
    content = RecordDict(dict(content.items()))  # the same content may go to every node
    if message_type == TRAIN and link.secagg and link.secagg_round is not None and link.secagg_round.rnd == rnd:
        routed = {
            str(sender): records.bytes_array(ct)
            for sender, ct in link.secagg_round.routed.get(link.client_of(node), {}).items()
        }
        record = records.pack(routed, link.seal_for(node, rnd, TRAIN))
        link.costs_of(rnd, node)["secagg_bytes"] += payload_bytes(RecordDict({SECURE: record}))
        content[SECURE] = record
    if not link.tee:
        return content
    for name, kind in (("model", MODEL_KIND), ("aggregate", APPLY)):
        if name not in content:
            continue
        encoded, spec = encode(link, cast(ArrayRecord, content.pop(name)))  # model/aggregate: ArrayRecords
        if node not in link.attested:  # no session: nothing sealed goes to it
            continue
        record = ConfigRecord({"sealed": link.seal_for(node, rnd, kind)(encoded)})
        key = "model" if name == "model" else SECURE
        link.costs_of(rnd, node)["payload_overhead_bytes"] += payload_bytes(
            RecordDict({key: record})
        ) - link.plain_bytes_of(spec, name)
        content[key] = record
    return content


def encode(link: Any, record: ArrayRecord) -> tuple[bytes, TensorSpec]:
    """The codec bytes of an ArrayRecord (encoded once however many clients it is sealed for)."""
    if link.encoded_for is not record:
        tensors = from_array_record(record)
        link.encoded_for, link.encoded = record, (codec.encode(tensors), spec_of(tensors))
    return link.encoded


def incoming(link: Any, node: int, rnd: int, kind: str, reply: Message) -> None:
    """A ``train``/``train.payload`` reply as the round sees it, in place: opened (tee), its sealed metrics
    merged, its masked vector kept for the unmasking (secagg, ``train``) and shown as the payload."""
    content = reply.content
    clear: dict[str, Any] = (
        dict(content["metrics"]) if "metrics" in content and isinstance(content["metrics"], MetricRecord) else {}
    )
    if SECURE not in content and not link.tee:
        return  # secagg: a report without a payload (a round that exchanges nothing)
    client = clear.get("client")
    if link.tee and (node not in link.attested or link.node_client.get(node) != client):
        link.rejected["no-session"] += 1
        raise SealError("no-session", f"node {node} (client {client}) has not attested the aggregator as this client")
    masked = link.secagg and kind == TRAIN
    if masked and (link.secagg_round is None or link.secagg_round.rnd != rnd):
        raise codec.CodecError("masked payload outside a secure-aggregation round")
    expected: TensorSpec | None = {"masked": ((link.secagg_round.server.length,), "uint64")} if masked else None
    arrays = records.unpack(
        content,
        link.open_from(node, rnd, kind, {"num_examples": int(clear["num_examples"])}),
        None if link.tee else expected,
        f"payload of client {client}",
    )
    if link.tee:
        if SEALED_METRICS not in arrays:
            raise codec.CodecError(f"payload of client {client}: the sealed record holds no {SEALED_METRICS!r}")
        clear.update(sealed_metrics(arrays.pop(SEALED_METRICS), client))
        if expected is not None:
            got = {n: (tuple(a.shape), str(a.dtype)) for n, a in arrays.items()}
            if got != expected:
                raise codec.CodecError(f"payload of client {client}: arrays {got}, expected {expected}")
    record_bytes = payload_bytes(RecordDict({SECURE: content[SECURE]}))
    if masked:
        link.secagg_round.masked[client] = arrays["masked"]
        link.costs_of(rnd, node)["payload_overhead_bytes"] += record_bytes - link.plain_bytes_of(
            link.secagg_round.spec, "payload"
        )
        arrays = {"masked": arrays["masked"].view(np.int64)}
    else:
        link.costs_of(rnd, node)["payload_overhead_bytes"] += record_bytes - link.plain_bytes_of(
            spec_of(arrays), "payload"
        )
    plain = RecordDict({n: r for n, r in content.items() if n not in (SECURE, "metrics")})
    if arrays:
        plain["payload"] = ArrayRecord({n: torch.from_numpy(a) for n, a in arrays.items()})
    plain["metrics"] = MetricRecord(clear)
    reply.content = plain


def sealed_metrics(array: np.ndarray, client: int | None) -> dict[str, Any]:
    """The metrics a client sealed into its reply (numbers only; never the fields the clear record sets)."""
    what = f"sealed metrics of client {client}"
    try:
        metrics = json.loads(array.tobytes().decode("utf-8")) if array.dtype == np.uint8 else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise codec.CodecError(f"{what}: not JSON ({exc})") from None
    if not isinstance(metrics, dict):
        raise codec.CodecError(f"{what}: not a JSON object of numbers")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise codec.CodecError(f"{what}: {key!r} must be a number")
        if key in CLEAR_METRICS:
            raise codec.CodecError(f"{what}: {key!r} may not be set there")
    return metrics


__all__ = ["encode", "incoming", "outgoing", "sealed_metrics"]
