"""In-process runtime: the ServerApp and N ClientApps in one Python process, no Ray, no network.

:class:`InProcessGrid` implements Flower's ``Grid`` interface. Every message is serialized to
Flower's protobuf wire format and parsed back on the other side, exactly as a SuperLink would carry
it, so the protocol code sees real messages (no shared objects between server and clients) and the
bytes counted are real. Clients run one after another; an exception in a client becomes an error
reply, as it would in a deployment.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from ..config import RunConfig
from ..workload import load_workload
from . import diagnostics

log = logging.getLogger(__name__)

CLIENT_ERROR_CODE = 500  # an exception raised while a client handled a message


def _wire_copy(message: Message) -> Message:
    """Serialize to Flower's protobuf wire format and parse back (what crossing a network does)."""
    proto = ProtoMessage()
    proto.ParseFromString(message_to_proto(message).SerializeToString())
    return message_from_proto(proto)


class InProcessGrid(Grid):
    """A Flower ``Grid`` that delivers messages to ClientApps living in this process."""

    def __init__(self, client_app: ClientApp, node_configs: list[dict[str, Any]], run_config: dict[str, Any],
                 *, run_id: int = 1) -> None:
        self._run = Run.create_empty(run_id)
        self._client_app = client_app
        self._contexts = {
            SUPERLINK_NODE_ID + 1 + i: Context(run_id=run_id, node_id=SUPERLINK_NODE_ID + 1 + i,
                                                node_config=dict(cfg), state=RecordDict(),
                                                run_config=dict(run_config))
            for i, cfg in enumerate(node_configs)
        }
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node not in self._contexts:
                raise ValueError(f"message for unknown node {node}")
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            delivered = _wire_copy(message)
            try:
                reply = self._client_app(delivered, self._contexts[node])
            except Exception as exc:  # the client failed: the server gets an error reply
                log.exception("client node %d failed on %s", node, message.metadata.message_type)
                reply = Message(Error(CLIENT_ERROR_CODE, f"{type(exc).__name__}: {exc}"), reply_to=delivered)
            reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self._replies[message.metadata.message_id] = _wire_copy(reply)
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def node_configs(cfg: RunConfig) -> list[dict[str, Any]]:
    """One node per client: its data partition (centralized: one node holding every shard)."""
    from ..workload import ALL_SHARDS

    if cfg.federation.strategy == "centralized":
        partitions = [ALL_SHARDS]
    else:
        partitions = list(range(cfg.federation.clients))
    configs = []
    for p in partitions:
        node: dict[str, Any] = {"partition-id": p, "num-partitions": cfg.federation.clients,
                                "diagnostics": True,
                                # where the client itself writes its decoded test translations
                                "output-dir": str(Path(cfg.out) / f"client-{'all' if p == ALL_SHARDS else p}")}
        if cfg.runtime.store == "disk":  # each client keeps <state-dir>/<client>/state.pt
            node["state-dir"] = str(Path(cfg.out) / "client-state")
        configs.append(node)
    return configs


def run_in_process(cfg: RunConfig, *, server_app: ServerApp | None = None,
                   client_app: ClientApp | None = None) -> dict[str, Any]:
    """Run a whole federation in this process; returns the summary (also written to ``cfg.out``)."""
    from .. import app as apps

    server_app = server_app or apps.server_app
    client_app = client_app or apps.client_app
    torch.set_num_threads(cfg.runtime.threads or os.cpu_count() or 1)
    load_workload(cfg)  # data problems surface here, before any client starts
    run_id = int(time.time_ns() % (1 << 62))
    run_config = {apps.CONFIG_KEY: cfg.to_json()}
    from ..secure import exchange as secure

    nodes = node_configs(cfg)
    if cfg.runtime.store == "disk" and not cfg.runtime.resume:
        # a fresh run: no client may pick up the snapshots of an earlier run in the same output folder
        shutil.rmtree(Path(cfg.out) / "client-state", ignore_errors=True)
    secure.provision_in_process(cfg, run_id, nodes)  # secure.mode tee: the attestation key pair, out of band
    grid = InProcessGrid(client_app, nodes, run_config, run_id=run_id)
    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        server_context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                                 run_config=run_config)
        server_app(grid, server_context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous
        apps.release_memory_store(run_id)
        diagnostics.clear(run_id)
        secure.release_in_process(run_id)
    import json

    return json.loads((Path(cfg.out) / "summary.json").read_text(encoding="utf-8"))
