"""The wire: named tensors <-> Flower ``ArrayRecord`` (numpy ``.npy`` bytes, never pickle), the message types
the server and its clients exchange, and the link a round sends them over: the :class:`Link` interface and the
:class:`PlainLink` (the secure channel, ``secure/channel.py``, wraps one; every exchange of the server goes through
it, the connection's ``identify`` queries included).

Everything a protocol exchanges goes through these functions, so the bytes counted are the bytes
of Flower's own protobuf serialization of the message content, and everything received is checked
for the expected names, shapes, dtypes and finite values before use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid

from .errors import TrustformerError
from .flower_internals import NODE_UNAVAILABLE, content_wire_bytes

log = logging.getLogger(__name__)

# Message types. A round: ``train`` (local training; the reply carries the payload or a report), ``train.payload``
# (a payload asked for after training), ``train.apply`` (the aggregate or the server's model; then a test
# evaluation). ``evaluate``: the final evaluation. ``query``: which client a node is. ``query.*``: the secure
# channel's own steps (attestation, secure aggregation), answered by its client mod.
TRAIN, PAYLOAD, APPLY, EVALUATE, QUERY = "train", "train.payload", "train.apply", "evaluate", "query"


class PayloadError(TrustformerError, ValueError):
    """A received payload does not have the expected names, shapes or dtypes, or holds NaN/Inf."""


class FederationError(TrustformerError, RuntimeError):
    """The federation cannot go on (too few valid clients, nodes missing, a secure-channel step failed)."""


TensorSpec = dict[str, tuple[tuple[int, ...], str]]


def to_array_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """Serialize named tensors (moved to CPU, contiguous) into an ArrayRecord, keeping their order."""
    record = ArrayRecord()
    for name, tensor in tensors.items():
        record[name] = Array(np.ascontiguousarray(tensor.detach().cpu().numpy()))
    return record


def from_array_record(
    record: ArrayRecord, expected: TensorSpec | None = None, *, what: str = "payload"
) -> dict[str, torch.Tensor]:
    """Decode an ArrayRecord into tensors; with ``expected``, reject anything that does not match it.

    Every array must be finite: NaN or Inf anywhere is a :class:`PayloadError`.
    """
    if expected is not None:
        missing = [n for n in expected if n not in record]
        extra = [n for n in record if n not in expected]
        if missing or extra:
            raise PayloadError(f"{what}: missing arrays {missing[:5]}, unexpected arrays {extra[:5]}")
    tensors: dict[str, torch.Tensor] = {}
    for name in record:
        array = record[name].numpy()
        if expected is not None:
            shape, dtype = expected[name]
            if tuple(array.shape) != tuple(shape) or str(array.dtype) != dtype:
                raise PayloadError(
                    f"{what}: array {name!r} has shape {tuple(array.shape)} dtype {array.dtype}, "
                    f"expected shape {tuple(shape)} dtype {dtype}"
                )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise PayloadError(f"{what}: array {name!r} contains NaN or Inf")
        tensors[name] = torch.from_numpy(array.copy())
    return tensors


def spec_of(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> TensorSpec:
    """The (shape, numpy dtype name) of every named tensor: what a receiver expects."""
    out: TensorSpec = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            out[name] = (tuple(t.shape), str(torch.empty(0, dtype=t.dtype).numpy().dtype))
        else:
            out[name] = (tuple(t.shape), str(t.dtype))
    return out


def record_spec(record: ArrayRecord) -> TensorSpec:
    """The spec of an ArrayRecord's arrays, read from their metadata (no decoding)."""
    return {name: (tuple(record[name].shape), _dtype_name(record[name].dtype)) for name in record}


def payload_bytes(content: RecordDict) -> int:
    """Length in bytes of Flower's protobuf serialization of a message's content."""
    return content_wire_bytes(content)


def _dtype_name(dtype: str) -> str:
    return str(np.dtype(dtype)) if dtype else dtype


def pack_flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Many tensors as one flat array (so a message carries one array header, not one per tensor)."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unpack_flat(flat: torch.Tensor, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Split a flat array back into named tensors of the given shapes, in order; the length must match
    exactly (:class:`PayloadError` otherwise)."""
    sizes = [int(np.prod(s)) for s in shapes.values()]
    if flat.dim() != 1 or flat.numel() != sum(sizes):
        raise PayloadError(f"packed array of shape {tuple(flat.shape)}: expected {sum(sizes)} values in one dimension")
    parts = torch.split(flat, sizes)
    return {name: part.reshape(shape) for (name, shape), part in zip(shapes.items(), parts, strict=True)}


@dataclass
class Delivery:
    """A message's reply as it reached the server: the reply (None: none within the wait; opened when it
    travelled sealed), the bytes sent down and up as they travelled, and why the reply cannot be used
    (``invalid``: it failed to open or unmask; the client is dropped from the round)."""

    reply: Message | None
    down: int
    up: int
    invalid: str | None = None


class Link(Protocol):
    """How a round's messages travel (:class:`PlainLink` below; the secure channel wraps one)."""

    def setup(self, nodes: list[int], needed: int) -> None:
        """Before round 1 (the secure channel: every client attests the aggregator)."""

    def prepare(self, rnd: int, nodes: list[int], exchange: bool) -> list[int]:
        """Before a round's ``train``; returns the nodes still in."""

    def send(
        self, nodes: Sequence[int], message_type: str, rnd: int, make_content: Callable[[int], RecordDict]
    ) -> dict[int, Delivery]:
        """One message per node (its content from ``make_content(node)``), each node's reply."""

    def payload_spec(self, spec: TensorSpec) -> TensorSpec:
        """What a payload of ``spec`` looks like when it reaches the server (secure aggregation: masked)."""

    def combine(
        self, rnd: int, payloads: dict[int, dict[str, torch.Tensor]], examples: dict[int, int], weighting: str | None
    ) -> tuple[list[dict[str, torch.Tensor]], list[int], dict[str, float]]:
        """The aggregation's inputs, their example counts and the seconds this took (secure aggregation: the
        mean alone, weight 1, unmasked from the sum with ``weighting``, the protocol's ``mean_weighting``)."""

    def finish_row(self, rnd: int, node: int, row: dict[str, Any]) -> None:
        """Add the link's own costs of the round to a client's line."""

    def summary(self) -> dict[str, Any] | None:
        """``summary.json["secure"]`` (None: nothing to report)."""


# --------------------------------------------------------------------------------------- the plain link

POLL_S = 0.5  # seconds between two pulls of the replies still awaited
TTL_MARGIN_S = 10.0  # a message outlives the wait for its reply by this much (the SuperLink then drops it)


def ttl(timeout: float | None) -> float | None:
    """Message lifetime for a wait of ``timeout`` seconds (None: Flower's default)."""
    return None if timeout is None else timeout + TTL_MARGIN_S


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> dict[int, Message]:
    """Push the messages, then pull their replies until all came or ``timeout`` seconds passed.

    Every reply the SuperLink holds when the wait ends counts: the last pull starts after the deadline. One pull
    can block for many seconds (it fetches a reply's tensors while the client is still uploading them), and
    replies that arrived meanwhile were not in its answer."""
    if not messages:
        return {}
    ids = list(grid.push_messages(messages))
    node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True) if mid}
    pending = set(node_of)
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: dict[int, Message] = {}
    while pending:
        last = deadline is not None and time.monotonic() >= deadline  # taken before the pull, not after
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[node_of[mid]] = reply
        if not pending or last:
            break
        time.sleep(POLL_S)
    return replies


def node_unavailable(reply: Message | None) -> bool:
    """The SuperLink answered for the node: it died (or left) while it held the message."""
    return reply is not None and reply.has_error() and reply.error.code == NODE_UNAVAILABLE


class PlainLink:
    """The :class:`Link` of ``secure.mode = none``: messages as they are, aggregation in the clear. The secure
    channel (``secure/channel.py``) wraps one of these, as Flower's secure-aggregation mod wraps a handler.

    ``restart_wait_s`` (``federation.restart_wait_s``): a node whose SuperNode died while it held a message (the
    SuperLink's "Node Unavailable") and that comes back within that many seconds (a restarted SuperNode keeps its
    node id) is sent the same message again; its state snapshots (``runtime/store.py``) make it compute what the
    first delivery would have, so the run goes on as if nothing happened. Both deliveries' bytes count."""

    def __init__(self, grid: Grid, timeout: float | None, restart_wait_s: float = 0.0) -> None:
        self.grid, self.timeout, self.restart_wait_s = grid, timeout, restart_wait_s

    def setup(self, nodes: list[int], needed: int) -> None:
        return None

    def prepare(self, rnd: int, nodes: list[int], exchange: bool) -> list[int]:
        return nodes

    def send(
        self, nodes: Sequence[int], message_type: str, rnd: int | str, make_content: Callable[[int], RecordDict]
    ) -> dict[int, Delivery]:
        """One message per node, each node's reply (``rnd``: the round, or ``"identify"`` for the connection's
        queries, as the messages' group id)."""
        contents = {node: make_content(node) for node in nodes}
        down = {node: payload_bytes(content) for node, content in contents.items()}
        replies = exchange(self.grid, [self._message(n, contents[n], message_type, rnd) for n in nodes], self.timeout)
        lost = [n for n in nodes if node_unavailable(replies.get(n))]
        back = self._back_online(lost) if lost and self.restart_wait_s > 0 else []
        if back:
            for node in back:
                log.warning("node %d came back after dying on %s of round %s: sent again", node, message_type, rnd)
                down[node] += payload_bytes(contents[node])
            again = exchange(self.grid, [self._message(n, contents[n], message_type, rnd) for n in back], self.timeout)
            replies.update({n: again[n] for n in back if n in again})
        return {node: Delivery(replies.get(node), down[node], _bytes_up(replies.get(node))) for node in nodes}

    def _message(self, node: int, content: RecordDict, message_type: str, rnd: int | str) -> Message:
        return Message(content, node, message_type, group_id=str(rnd), ttl=ttl(self.timeout))

    def _back_online(self, nodes: list[int]) -> list[int]:
        """The nodes among ``nodes`` online again within ``restart_wait_s`` (the rest are dropped by the round)."""
        deadline = time.monotonic() + self.restart_wait_s
        while True:
            online = set(self.grid.get_node_ids())
            back = [n for n in nodes if n in online]
            if len(back) == len(nodes) or time.monotonic() >= deadline:
                return back
            time.sleep(POLL_S)

    def payload_spec(self, spec: TensorSpec) -> TensorSpec:
        return spec

    def combine(
        self, rnd: int, payloads: dict[int, dict[str, torch.Tensor]], examples: dict[int, int], weighting: str | None
    ) -> tuple[list[dict[str, torch.Tensor]], list[int], dict[str, float]]:
        return list(payloads.values()), [examples[n] for n in payloads], {}

    def finish_row(self, rnd: int, node: int, row: dict[str, Any]) -> None:
        return None

    def summary(self) -> dict[str, Any] | None:
        return None


def _bytes_up(reply: Message | None) -> int:
    return payload_bytes(reply.content) if reply is not None and reply.has_content() else 0
