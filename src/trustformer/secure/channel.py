"""The server's side of the secure channel: a :class:`~trustformer.wire.Link` that wraps the plain one, the
way the client mod (``mod.py``) wraps the client's handlers. The round loop and the protocols never see it.

``none``: :func:`secure_link` returns the plain link unchanged.

``tee`` (attested aggregator, sealed payloads; the TEE is a software emulation, see ``tee.py``): before
round 1 two ``query.attest`` messages per client — the client answers the first with a fresh nonce and
X25519 key; the second carries the aggregator's signed quote, which the client verifies
(``attestation.py``) before it trains or sends anything. Every ``train`` and ``train.payload`` reply then
travels sealed (``sealing.py``) in a ``secure`` record, its metrics sealed with it (bound to the client's
example count; only the client id, round and example count in clear); the ``train.apply`` aggregate and a
model sent down (Phong) travel sealed too, encoded with the safe codec (``codec.py``). A reply the
aggregator cannot open drops that client for the round, like any invalid payload; a message a client
rejects makes its reply an error, with the same effect.

``secagg`` (pairwise-masked secure aggregation, ``secagg.py``), in every exchange round: ``query.secagg``
*keys* (each client advertises two X25519 keys and the names/shapes of the payload it will send, which must
be those the configuration gives) → *shares* (the aggregator broadcasts the keys; each client returns its
encrypted Shamir shares) → ``train`` (carrying the shares routed to that client; the client's mod masks its
payload) → *unmask* (the survivors reveal the shares the aggregator needs to remove the masks). The
aggregator learns only the sum, turns it into the mean the protocol declares (``mean_weighting``: by
examples or uniform) and hands the protocol's ``aggregate`` that mean alone. Nothing here names a protocol.
``tee+secagg`` seals every one of these messages as well.

Costs per (round, client) line of ``metrics.jsonl``: ``attest_bytes``/``attest_s`` (round 1),
``seal_s``/``open_s`` (both ends), ``secagg_bytes``/``secagg_s`` (the extra secure-aggregation
messages and steps), ``payload_overhead_bytes`` (what the secure form of the ``train`` payload and
the aggregate costs beyond their plain ArrayRecords); the extra messages are counted in
``bytes_up``/``bytes_down`` too. ``summary.json["secure"]`` adds them up.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, Message, RecordDict

from ..config import RunConfig
from ..recording.recorder import RunRecorder
from ..wire import PAYLOAD, TRAIN, Delivery, Link, PayloadError, TensorSpec, payload_bytes, to_array_record
from . import channel_messages as messages
from .channel_attest import attest, start_tee
from .channel_errors import SecureChannelError
from .channel_secagg import SecAggRound, prepare_secagg, secagg_mean
from .channel_summary import count_client_rejection_into, secure_summary
from .masking import SecAggError
from .provision import uses_secagg, uses_tee
from .records import ATTEST, SECAGG
from .sealing import SealError
from .tee import TEEBackend

log = logging.getLogger(__name__)


def secure_link(
    cfg: RunConfig,
    link: Link,
    *,
    run_id: int,
    recorder: RunRecorder,
    drop: Callable[[int, int, str], None],
    clients: Mapping[int, int],
    payload_spec: Callable[[], TensorSpec],
) -> Link:
    """``link`` wrapped by the secure channel of ``secure.mode`` (``none``: ``link`` itself)."""
    if cfg.secure.mode == "none":
        return link
    return SecureLink(
        cfg, link, run_id=run_id, recorder=recorder, drop=drop, clients=clients, payload_spec=payload_spec
    )


class SecureLink:
    """The aggregator's side of the secure channel for one run (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        link: Link,
        *,
        run_id: int,
        recorder: RunRecorder,
        drop: Callable[[int, int, str], None],
        clients: Mapping[int, int],
        payload_spec: Callable[[], TensorSpec],
    ) -> None:
        self.cfg, self.link, self.run_id, self.recorder, self.drop = cfg, link, run_id, recorder, drop
        self.mode = cfg.secure.mode
        self.tee, self.secagg = uses_tee(self.mode), uses_secagg(self.mode)
        self.configured_spec = payload_spec
        self.backend: TEEBackend | None = None
        self.key_origin = ""
        self.node_client: dict[int, int] = {}  # node id -> client id, as attested (tee) or announced (secagg)
        self.clients = clients  # the round loop's node id -> client id
        self.attested: set[int] = set()
        self.counts: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.extra: dict[tuple[int, int], Counter[str]] = {}
        self.server_round_s: Counter[int] = Counter()  # secagg: the aggregator's own computation per round
        self.secagg_rounds = 0
        self.bounds: list[float] = []
        self.measured_errors: list[float] = []
        self.float64_rounding: list[float] = []
        self.dropped_after_setup = 0
        self.secagg_round: SecAggRound | None = None  # the exchange round whose masks are not removed yet
        self.encoded_for: ArrayRecord | None = None  # the record whose codec bytes ``encoded`` holds
        self.encoded: tuple[bytes, TensorSpec] = (b"", {})
        self._plain_bytes: dict[tuple, int] = {}

    # -- helpers

    def costs_of(self, rnd: int, node: int) -> Counter[str]:
        # bytes and seconds: typeshed types a Counter's values as int, so adding seconds needs a type: ignore
        return self.extra.setdefault((rnd, node), Counter())

    def client_of(self, node: int) -> int:
        client = self.node_client.get(node, self.clients.get(node))
        if client is None:
            raise SealError("no-session", f"node {node} has no known client id")
        return client

    def seal_for(self, node: int, rnd: int, kind: str) -> Callable[[bytes], bytes] | None:
        if not self.tee:
            return None

        def seal(data: bytes) -> bytes:
            started = time.perf_counter()
            sealed = cast(TEEBackend, self.backend).seal(self.client_of(node), data, round_=rnd, kind=kind)
            # float seconds in a Counter (see costs_of)
            self.costs_of(rnd, node)["seal_s"] += time.perf_counter() - started  # type: ignore[assignment]
            self.counts["sealed"] += 1
            return sealed

        return seal

    def open_from(self, node: int, rnd: int, kind: str, bound: dict[str, Any] | None = None):
        if not self.tee:
            return None

        def open_(data: bytes) -> bytes:
            started = time.perf_counter()
            self.counts["sealed"] += 1  # by the client
            try:
                plain = cast(TEEBackend, self.backend).open(
                    self.client_of(node), data, round_=rnd, kind=kind, bound=bound
                )
            except SealError as exc:
                self.rejected[exc.reason] += 1
                raise
            finally:
                # float seconds in a Counter (see costs_of)
                self.costs_of(rnd, node)["open_s"] += time.perf_counter() - started  # type: ignore[assignment]
            self.counts["opened"] += 1
            return plain

        return open_

    def plain_bytes_of(self, spec: TensorSpec, key: str) -> int:
        """Bytes of the plain ArrayRecord of arrays with this spec (its size depends on the spec only)."""
        cache_key = (key, tuple(sorted((n, tuple(s), d) for n, (s, d) in spec.items())))
        if cache_key not in self._plain_bytes:
            zeros = {n: torch.zeros(s, dtype=getattr(torch, d)) for n, (s, d) in spec.items()}
            self._plain_bytes[cache_key] = payload_bytes(RecordDict({key: to_array_record(zeros)}))
        return self._plain_bytes[cache_key]

    def query(
        self, rnd: int, nodes: list[int], step: str, make, budget: str
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Send one ``query.*`` step; count its bytes and the client's seconds under ``budget``; drop
        the clients that fail it. Returns the good replies and the failures' reasons."""
        message_type = ATTEST if budget == "attest" else SECAGG
        ok: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for node, got in self.link.send(nodes, message_type, rnd, make).items():
            extra = self.costs_of(rnd, node)
            extra[f"{budget}_bytes"] += got.down
            extra["bytes_down"] += got.down
            reply = got.reply
            why = (
                f"no reply to {message_type} ({step})"
                if reply is None
                else f"{message_type} ({step}) failed: {reply.error.reason}"
                if reply.has_error()
                else None
            )
            if why is not None:
                self.count_client_rejection(why)
                self.drop(rnd, node, why)
                failed[node] = why
                continue
            assert reply is not None  # why is None only for a reply without an error
            extra[f"{budget}_bytes"] += got.up
            extra["bytes_up"] += got.up
            metrics: Mapping[str, Any] = reply.content.get("metrics", {})
            for key in ("attest_s", "secagg_s", "seal_s", "open_s"):
                if key in metrics:
                    extra[key] += float(metrics[key])  # type: ignore[assignment]  # float seconds, see costs_of
            self.counts["opened"] += int("open_s" in metrics)  # the client opened the sealed request
            ok[node] = reply
        return ok, failed

    def count_client_rejection(self, why: str) -> None:
        if "attestation failed" in why:
            self.rejected["attestation (by a client)"] += 1
        else:
            count_client_rejection_into(self.rejected, why)

    # -- before round 1

    def setup(self, nodes: list[int], needed: int) -> None:
        """tee: every client attests the aggregator before round 1; too few attested clients stop the run."""
        log.info(
            "secure exchange: secure.mode = %s%s",
            self.mode,
            " · TEE EMULATED IN SOFTWARE (no hardware protection)" if self.tee else "",
        )
        if not self.tee:
            return
        start_tee(self, nodes, needed)

    # -- every round

    def prepare(self, rnd: int, participants: list[int], exchange: bool) -> list[int]:
        """Before a round's ``train``: tee attests nodes seen for the first time (a client that rejoined);
        secagg runs the keys and shares steps of exchange rounds. Returns the participants still in."""
        if self.tee:
            new = [n for n in participants if n not in self.attested]
            if new:
                attest(self, rnd, new)
            participants = [n for n in participants if n in self.attested]
        if not (self.secagg and exchange) or not participants:
            return self.link.prepare(rnd, participants, exchange)
        return prepare_secagg(self, rnd, participants, exchange)

    # -- messages

    def send(
        self, nodes: Sequence[int], message_type: str, rnd: int, make_content: Callable[[int], RecordDict]
    ) -> dict[int, Delivery]:
        """The plain link's ``send`` with every content sealed or given its shares on the way out, and every
        ``train``/``train.payload`` reply opened (and its masked vector kept) on the way in."""
        retries: set[int] = set()  # train.payload asked again of another worker (FedPC): sealed as a retry

        def outgoing(node: int) -> RecordDict:
            content = make_content(node)
            if message_type == PAYLOAD and dict(content["config"]).get("retry"):
                retries.add(node)
            return messages.outgoing(self, node, message_type, rnd, content)

        deliveries = self.link.send(nodes, message_type, rnd, outgoing)
        if message_type in (TRAIN, PAYLOAD):
            for node, got in deliveries.items():
                if got.reply is None or got.reply.has_error():
                    continue
                kind = message_type + (".retry" if node in retries else "")
                try:
                    messages.incoming(self, node, rnd, kind, got.reply)
                except (PayloadError, SecAggError) as exc:
                    got.invalid = str(exc)
                except Exception as exc:  # anything a client's reply makes us raise drops that client
                    got.invalid = f"{type(exc).__name__}: {exc}"
        return deliveries

    def payload_spec(self, spec: TensorSpec) -> TensorSpec:
        if self.secagg and self.secagg_round is not None:
            return {"masked": ((self.secagg_round.server.length,), "int64")}
        return spec

    def combine(
        self, rnd: int, payloads: dict[int, dict[str, torch.Tensor]], examples: dict[int, int], weighting: str | None
    ) -> tuple[list[dict[str, torch.Tensor]], list[int], dict[str, float]]:
        """secagg: the survivors' mean, unmasked from the masked sum (weighted as the protocol declares), as the
        protocol's only input; otherwise the payloads as they are."""
        if not self.secagg:
            return self.link.combine(rnd, payloads, examples, weighting)
        return secagg_mean(self, rnd, payloads, examples, weighting)

    def finish_row(self, rnd: int, node: int, row: dict[str, Any]) -> None:
        """Add this round's secure costs to a client's metrics line (and its extra messages to its bytes)."""
        extra = self.extra.pop((rnd, node), Counter())
        extra.update(self.extra.pop((0, node), Counter()))  # the attestation before the first round
        for key in [k for k in row if k.startswith("secure_") and k.endswith("_s")]:
            what = key[:-2].rsplit("_", 1)[1]  # the client's own seconds per message: seal | open | secagg
            extra[f"{what}_s"] += float(row.pop(key))  # type: ignore[assignment]  # float seconds, see costs_of
            self.counts["opened"] += int(what == "open")
        row["bytes_up"] += int(extra.pop("bytes_up", 0))
        row["bytes_down"] += int(extra.pop("bytes_down", 0))
        fields = ["attest_bytes", "attest_s"] if "attest_bytes" in extra else []
        fields += ["seal_s", "open_s"] if self.tee else []
        fields += ["secagg_bytes", "secagg_s"] if self.secagg else []
        fields += ["payload_overhead_bytes"]
        for key in fields:
            value = extra.get(key, 0)
            row[key] = int(value) if key.endswith("_bytes") else round(float(value), 6)
        self.link.finish_row(rnd, node, row)

    # what the summary counts over the whole run: kept in every checkpoint, so a resumed run reports the whole run
    COUNTED: tuple[str, ...] = ("counts", "rejected", "server_round_s", "secagg_rounds", "bounds", "measured_errors")
    COUNTED += ("float64_rounding", "dropped_after_setup")

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`summary` has counted so far (the checkpoint's part of the secure link)."""
        return {name: copy.copy(getattr(self, name)) for name in self.COUNTED}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.COUNTED:
            current = getattr(self, name)
            setattr(self, name, type(current)(state[name]) if isinstance(current, Counter) else state[name])

    def summary(self) -> dict[str, Any] | None:
        """``summary.json["secure"]``: mode, backend, counts, overhead (bytes, seconds), quantisation error."""
        return secure_summary(self)


__all__ = ["SecureChannelError", "SecureLink", "secure_link"]
