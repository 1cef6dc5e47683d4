"""In-process runtime: the ServerApp and N ClientApps in one Python process, no Ray, no network.

:class:`InProcessGrid` implements Flower's ``Grid`` interface. Every message is serialized to
Flower's protobuf wire format and parsed back on the other side, exactly as a SuperLink would carry
it, so the protocol code sees real messages (no shared objects between server and clients) and the
bytes counted are real. Clients run one after another; an exception in a client becomes an error
reply, as it would in a deployment.

``federation.faults`` (simulation only) are applied here, at the message boundary, to a client's
reply to the ``train`` message of a round (or the ``train.payload`` / ``train.apply`` message the
entry names), so the server's real validation and drop path handles them: ``nan`` and
``wrong_shape`` corrupt the payload (a sealed or masked record loses its last byte), ``empty_reply``
sends no content, ``malformed_reply`` replaces the metrics record by one of strings,
``huge_num_examples`` claims 10^15 examples, ``replay`` sends the client's reply to its previous
``train`` message again (its previous message of any type in round 1), ``restart`` lets the client handle the message
and then answers for its node as ``dropout`` does (the node is back at once), ``dropout`` answers with the
SuperLink's "Node Unavailable" error without running the client, ``stall`` runs the client and never
delivers its reply (the server stops waiting after ``federation.round_timeout_s``).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .. import app as apps
from ..config import CONFIG_KEY, Fault, RunConfig
from ..core.shared import ALL_SHARDS
from ..flower_internals import (
    NODE_UNAVAILABLE,
    SUPERLINK_NODE_ID,
    Run,
    empty_run,
    set_message_id,
    task_identity,
    wire_copy,
)
from ..registry import protocol_spec
from ..runtime import diagnostics
from ..runtime.node import check_resumable, keeps_state_on_disk, node_defaults, release_memory_store, torch_threads
from ..secure.provision import provisioned
from ..tasks.run import load_task

log = logging.getLogger(__name__)

CLIENT_ERROR_CODE = 500  # an exception raised while a client handled a message
HUGE_NUM_EXAMPLES = 10**15  # what the huge_num_examples fault claims


class InProcessGrid(Grid):
    """A Flower ``Grid`` that delivers messages to ClientApps living in this process."""

    def __init__(
        self,
        client_app: ClientApp,
        node_configs: list[dict[str, Any]],
        run_config: dict[str, Any],
        *,
        run_id: int = 1,
        faults: Iterable[Fault] = (),
    ) -> None:
        self._run = empty_run(run_id)
        self._client_app = client_app
        self._contexts = {
            SUPERLINK_NODE_ID + 1 + i: Context(
                run_id=run_id,
                node_id=SUPERLINK_NODE_ID + 1 + i,
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, cfg in enumerate(node_configs)
        }
        self._replies: dict[str, Message] = {}
        self._faults = {(f.client, f.round): f for f in faults}
        self._history: dict[int, dict[str, RecordDict]] = {}  # node -> message type -> content of its last reply
        self._last: dict[int, RecordDict] = {}  # node -> content of its last reply of any type
        self.injected: list[tuple[int, int, str]] = []  # (client, round, kind) of the faults applied
        self._restarted: set[tuple[int, int]] = set()  # (client, round) of the restart faults applied

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in self._contexts:
                raise ValueError(f"message for unknown node {node}")
            set_message_id(message, uuid.uuid4().hex)
            delivered = wire_copy(message)
            fault = self._fault_for(node, message)
            reply: Message | None  # None: a stalled reply (fault injection)
            if fault is not None and fault.kind == "dropout":  # the node is gone: the SuperLink answers for it
                reply = Message(
                    Error(NODE_UNAVAILABLE, "Node Unavailable (injected fault: dropout)"), reply_to=delivered
                )
            elif fault is not None and fault.kind == "restart":  # handled, then the node died before replying
                self._restarted.add((fault.client, fault.round))
                self.injected.append((fault.client, fault.round, fault.kind))
                self._client_app(delivered, self._contexts[node])
                reply = Message(
                    Error(NODE_UNAVAILABLE, "Node Unavailable (injected fault: restart)"), reply_to=delivered
                )
                fault = None  # back at once: the node is online again, and a resent message goes through
            else:
                try:
                    reply = self._client_app(delivered, self._contexts[node])
                except Exception as exc:  # the client failed: the server gets an error reply
                    log.exception("client node %d failed on %s", node, message.metadata.message_type)
                    reply = Message(Error(CLIENT_ERROR_CODE, f"{type(exc).__name__}: {exc}"), reply_to=delivered)
            set_message_id(reply, uuid.uuid4().hex)
            if fault is not None and not reply.has_error():
                reply = self._inject(fault, node, delivered, reply)
            elif self._faults and not reply.has_error():  # what a replay fault may send again later
                self._remember(node, message.metadata.message_type, reply)
            ids.append(message.metadata.message_id)
            if reply is not None:  # None: a stalled reply, never delivered
                self._replies[message.metadata.message_id] = wire_copy(reply)
        return ids

    # -- fault injection (federation.faults)

    def _fault_for(self, node: int, message: Message) -> Fault | None:
        if not self._faults:
            return None
        client = int(self._contexts[node].node_config.get("partition-id", -1))
        try:
            rnd = int(message.metadata.group_id)
        except ValueError:
            return None
        fault = self._faults.get((client, rnd))
        if fault is not None and fault.kind == "restart" and (client, rnd) in self._restarted:
            return None  # the restarted node handles a message sent again
        return fault if fault is not None and fault.message == message.metadata.message_type else None

    def _remember(self, node: int, message_type: str, reply: Message) -> None:
        content = wire_copy(reply).content
        self._history.setdefault(node, {})[message_type] = content
        self._last[node] = content

    def _inject(self, fault: Fault, node: int, delivered: Message, reply: Message) -> Message | None:
        """Client ``fault.client``'s reply to ``train`` of round ``fault.round``, as the fault makes it."""
        log.warning(
            "injected fault (federation.faults): client %d, round %d, %s", fault.client, fault.round, fault.kind
        )
        self.injected.append((fault.client, fault.round, fault.kind))
        earlier = self._history.get(node, {}).get("train") or self._last.get(node)
        self._remember(node, "train", reply)
        content = reply.content
        if fault.kind == "stall":
            return None
        if fault.kind == "empty_reply":
            content = RecordDict()
        elif fault.kind == "malformed_reply":
            content["metrics"] = ConfigRecord({"client": "one", "num_examples": "many"})
        elif fault.kind == "huge_num_examples":
            metrics: MutableMapping[str, Any] = content["metrics"]  # a MetricRecord (Flower: a union of records)
            metrics["num_examples"] = HUGE_NUM_EXAMPLES
        elif fault.kind == "replay":
            if earlier is None:
                raise ValueError(f"federation.faults: client {fault.client} has no earlier reply to replay")
            content = earlier
        elif fault.kind in ("nan", "wrong_shape"):
            _corrupt_payload(content, fault.kind)
        return Message(content, reply_to=delivered)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def _corrupt_payload(content: RecordDict, kind: str) -> None:
    """``nan``: the first float array of the payload gets a NaN; ``wrong_shape``: the first array loses its
    last row. A secure record (sealed or masked) loses its last byte instead."""
    if "payload" in content:
        record: MutableMapping[str, Any] = content["payload"]  # Flower types a record as a union of the kinds
        arrays = {name: record[name].numpy().copy() for name in record}
        if kind == "nan":
            name = next(n for n, a in arrays.items() if a.dtype.kind == "f")
            arrays[name].reshape(-1)[0] = float("nan")
        else:
            name = next(iter(arrays))
            arrays[name] = arrays[name][:-1].copy()
        content["payload"] = ArrayRecord({n: torch.from_numpy(a) for n, a in arrays.items()})
        return
    if "secure" in content:
        secure: MutableMapping[str, Any] = content["secure"]  # its kind depends on secure.mode
        key = next(iter(secure))
        secure[key] = bytes(secure[key])[:-1]
        return
    raise ValueError(f"federation.faults: kind {kind} needs a payload, and this reply carries none")


def node_configs(cfg: RunConfig) -> list[dict[str, Any]]:
    """One node per client: its data partition (centralized: one node holding every shard), where it writes
    its translations and its final model, and (state on disk) where it keeps its state."""
    pooled = protocol_spec(cfg.federation.strategy).pools_data
    partitions = [ALL_SHARDS] if pooled else list(range(cfg.federation.clients))
    return [
        {
            "partition-id": p,
            "num-partitions": cfg.federation.clients,
            "diagnostics": cfg.eval.diagnostics,
            **node_defaults(cfg, p),
        }
        for p in partitions
    ]


def run_in_process(
    cfg: RunConfig,
    *,
    server_app: ServerApp | None = None,
    client_app: ClientApp | None = None,
    node_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run a whole federation in this process; returns the summary (also written to ``cfg.out``).

    ``node_config``: entries added to every client's node config, what each client would set for itself
    (e.g. its trust anchors ``trusted-key`` and ``expected-measurement``, kept over the runtime's own)."""
    server_app, client_app = server_app or apps.server_app, client_app or apps.client_app
    torch.set_num_threads(torch_threads(cfg.runtime.threads))
    load_task(cfg)  # data problems surface here, before any client starts
    run_id = int(time.time_ns() % (1 << 62))
    run_config: dict[str, Any] = {CONFIG_KEY: cfg.to_json()}
    nodes = node_configs(cfg)
    for node in nodes:
        node.update(node_config or {})
    if cfg.runtime.resume:
        check_resumable(cfg, nodes)  # every client finds its state, or the resume is refused before any round
    elif keeps_state_on_disk(cfg):
        # a fresh run: no client may pick up the snapshots of an earlier run in the same output folder
        shutil.rmtree(Path(cfg.out) / "client-state", ignore_errors=True)
    try:
        # task_identity: the ServerApp's, which the messages it creates carry; provisioned: (secure.mode tee) the
        # attestation key pair, out of band
        with task_identity(run_id), provisioned(cfg, run_id, nodes):
            grid = InProcessGrid(client_app, nodes, run_config, run_id=run_id, faults=cfg.federation.fault_plan())
            server_app(
                grid,
                Context(
                    run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=run_config
                ),
            )
    finally:
        release_memory_store(run_id)
        diagnostics.clear(run_id)
    return json.loads((Path(cfg.out) / "summary.json").read_text(encoding="utf-8"))
