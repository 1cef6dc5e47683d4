"""The client nodes of a run, as the server meets them: how many it waits for, and which client (data partition)
each node is, from its answer to a ``query``."""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..config import RunConfig
from ..registry import protocol_spec
from ..wire import QUERY, PlainLink
from .replies import ReplyError
from .rounds import FederationError

log = logging.getLogger(__name__)


def expected_nodes(cfg: RunConfig) -> int:
    """One node when the protocol pools every shard on it (the centralized reference), else one per client."""
    return 1 if protocol_spec(cfg.federation.strategy).pools_data else cfg.federation.clients


class Nodes:
    """The client nodes of a run: which client (data partition) each node is, from its answer to a ``query``;
    a client that reconnects under a new node id retires its old one."""

    def __init__(self, grid: Grid, cfg: RunConfig, node_wait_s: float | None = None) -> None:
        fed = cfg.federation
        self.grid = grid
        self.timeout = fed.round_timeout_s or None
        self.wait_s = fed.node_wait_s if node_wait_s is None else node_wait_s
        self.expected = expected_nodes(cfg)
        self.needed = min(fed.min_clients or self.expected, self.expected)
        self.clients: dict[int, int] = {}  # node id -> client (partition) id
        self.retired: set[int] = set()
        self._first = True

    def connected(self) -> list[int]:
        """The connected clients' node ids in client order: at the start, waits for every expected client
        (up to ``federation.node_wait_s``); later, for ``federation.min_clients``."""
        want = self.expected if self._first else self.needed
        self._first = False
        return self.wait_for(want=want, need=self.needed, wait_s=self.wait_s)

    def identify(self, nodes: list[int]) -> list[int]:
        """Ask the nodes not met yet which client they are (a ``query``); return the nodes of known
        clients in client order. A client answering from a new node id retires its old one."""
        unknown = [n for n in nodes if n not in self.clients and n not in self.retired]
        deliveries = PlainLink(self.grid, self.timeout).send(
            unknown, QUERY, "identify", lambda _node: RecordDict({"config": ConfigRecord({"round": 0})})
        )
        replies = {node: d.reply for node, d in deliveries.items() if d.reply is not None}
        for node in unknown:
            reply = replies.get(node)
            if reply is None or reply.has_error():
                log.warning(
                    "node %d did not say which client it is (%s); left out for now",
                    node,
                    "no reply" if reply is None else reply.error.reason,
                )
                continue
            try:
                record = reply.content["metrics"]
                client = record["client"] if isinstance(record, MetricRecord) else None
                if isinstance(client, bool) or not isinstance(client, int):
                    raise ReplyError(f"'client' must be an integer, got {client!r}")
            except (KeyError, ReplyError) as exc:
                log.warning("node %d did not say which client it is (malformed reply: %s); left out for now", node, exc)
                continue
            for old in [n for n, c in self.clients.items() if c == client]:
                del self.clients[old]
                self.retired.add(old)
                log.info("client %d reconnected as node %d (was node %d)", client, node, old)
            self.clients[node] = client
        return sorted((n for n in nodes if n in self.clients), key=lambda n: self.clients[n])

    def wait_for(self, *, want: int, need: int, wait_s: float) -> list[int]:
        """Waits up to ``wait_s`` seconds for ``want`` connected clients; fewer than ``need`` after that is a
        FederationError."""
        started = time.monotonic()
        shown: tuple[int, ...] | None = None
        while True:
            nodes = self.identify(sorted(self.grid.get_node_ids()))
            if len(nodes) >= want:
                return nodes
            connected = tuple(sorted(self.clients[n] for n in nodes))
            if connected != shown:  # who is connected so far, each time it changes
                log.info(
                    "waiting for client nodes: %d of %d connected (client%s %s) · %.0f s of %.0f s "
                    "(federation.node_wait_s)",
                    len(nodes),
                    want,
                    "" if len(nodes) == 1 else "s",
                    ", ".join(map(str, connected)) or "none",
                    time.monotonic() - started,
                    wait_s,
                )
                shown = connected
            if time.monotonic() > started + wait_s:
                if len(nodes) >= need:
                    return nodes
                raise FederationError(
                    f"only {len(nodes)} of {want} client node(s) connected within {wait_s:.0f} s "
                    f"(federation.node_wait_s); at least {need} required (federation.min_clients)"
                )
            time.sleep(0.5)


__all__ = ["Nodes", "expected_nodes"]
