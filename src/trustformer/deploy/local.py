"""A whole federation on one machine: a SuperLink and N SuperNodes as processes on 127.0.0.1 (for trying a
deployment out, and for the tests), started with ``launch.py``'s server and client sides."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ..config import RunConfig
from ..registry import protocol_spec
from .certs import Credentials, write_credentials
from .launch import (
    RETRY_S,
    ServerSide,
    connection_outcome,
    deployment_config,
    node_config,
    refused,
    start_server,
    start_supernode,
)
from .processes import DeployError, Proc

log = logging.getLogger(__name__)


class LocalFederation:
    """A SuperLink and N SuperNodes as processes on 127.0.0.1, all under one folder::

        <root>/creds/        CA, server certificate, node keys (made if missing)
        <root>/server/       SuperLink database, log, flwr CLI settings, the app folder
        <root>/client-<i>/   a SuperNode: its log, node config, state/ and output/

    Use as a context manager: leaving it stops every process it started.
    """

    def __init__(
        self, root: str | Path, clients: int, *, creds: Credentials | None = None, extra_keys: tuple[str, ...] = ()
    ) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.clients = clients
        self.creds = creds or Credentials(self.root / "creds")
        if not self.creds.ca_cert.exists():
            write_credentials(self.creds.root, node_names=[f"client-{i}" for i in range(clients)] + list(extra_keys))
        self.server: ServerSide | None = None
        self.port: int | None = None
        self._closed = False
        # a new local federation starts from a new SuperLink state: a database left by an earlier one
        # would still count its (dead) SuperNodes as online and refuse the new ones for a minute
        for stale in (self.root / "server").glob("superlink.db*"):
            stale.unlink()
        self.nodes: dict[int, Proc] = {}
        self.others: list[Proc] = []
        self.pins: dict[str, str] = {}  # secure.mode tee: every client's trust anchors (one user runs both sides)

    def client_dir(self, partition: int) -> Path:
        return self.root / ("client-all" if partition < 0 else f"client-{partition}")

    def start_server(self) -> ServerSide:
        """Start (or restart, on the same port and database) the SuperLink; register client-0 … client-N-1."""
        keys = [self.creds.node_public_key(f"client-{i}") for i in range(self.clients)]
        self.server = start_server(self.root / "server", self.creds, port=self.port, public_keys=keys)
        self.port = int(self.server.superlink.info["port"])
        return self.server

    def start_client(
        self,
        partition: int,
        *,
        key_name: str | None = None,
        train_file: str | Path | None = None,
        retry_refused_s: float = 0.0,
    ) -> Proc:
        """Start client ``partition``'s SuperNode (key ``client-<partition>`` unless ``key_name``).

        ``retry_refused_s``: while the SuperLink refuses the node (a SuperNode restarted after a
        crash is refused until its old instance misses its heartbeats, up to a minute), start it
        again every few seconds, for up to that long (in a background thread)."""
        assert self.server is not None, "start_server first"
        folder = self.client_dir(partition) if key_name is None else self.root / key_name
        config = node_config(partition, folder / "state", folder / "output", train_file, pins=self.pins)

        def start() -> Proc:
            assert self.server is not None
            proc = start_supernode(
                folder,
                self.server.address,
                self.creds.ca_cert,
                self.creds.node_key(key_name or f"client-{partition}"),
                config,
                name=f"SuperNode of client {partition}",
            )
            if key_name is None:
                old = self.nodes.get(partition)
                if old is not None and old.alive():
                    old.stop()
                self.nodes[partition] = proc
            else:
                self.others.append(proc)
            return proc

        proc = start()
        if retry_refused_s > 0:
            until = time.monotonic() + retry_refused_s

            def retry(current: Proc) -> None:
                while not self._closed and time.monotonic() < until:
                    outcome = connection_outcome(current)
                    if outcome == "connected" or (outcome == "exited" and not refused(current)):
                        return
                    if outcome == "exited":
                        log.info("%s refused (its old instance still counts as online); trying again", current.name)
                        time.sleep(RETRY_S)
                        if not self._closed:
                            current = start()
                    else:
                        time.sleep(0.5)

            threading.Thread(target=retry, args=(proc,), daemon=True).start()
        return proc

    def start_clients(self) -> None:
        for partition in range(self.clients):
            self.start_client(partition)

    @classmethod
    def for_run(cls, root: str | Path, cfg: RunConfig) -> LocalFederation:
        """A started federation for ``cfg``: the SuperLink and one SuperNode per client (centralized:
        one holding every shard). Stops what it started if starting fails."""
        from ..core.shared import ALL_SHARDS
        from ..runtime.client_nodes import expected_nodes
        from ..secure.attestation import load_signing_key
        from ..secure.provision import client_pins, uses_tee

        fed = cls(root, expected_nodes(cfg))
        if uses_tee(cfg.secure.mode):
            fed.pins = client_pins(cfg, load_signing_key(cfg.secure.signing_key) if cfg.secure.signing_key else None)
        try:
            fed.start_server()
            if protocol_spec(cfg.federation.strategy).pools_data:
                fed.start_client(ALL_SHARDS, key_name="client-0")
            else:
                fed.start_clients()
        except BaseException:
            fed.close()
            raise
        return fed

    def run(self, cfg: RunConfig, *, timeout_s: float = 3600.0) -> tuple[int, str]:
        assert self.server is not None, "start_server first"
        return self.server.run(cfg, timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL every process started here at once (a hard time limit ran out)."""
        self._closed = True
        for proc in [*self.nodes.values(), *self.others, *([self.server.superlink] if self.server else [])]:
            proc.kill()

    def close(self) -> None:
        """Stop every process started here (clients first)."""
        self._closed = True
        for proc in [*self.nodes.values(), *self.others]:
            proc.stop(grace_s=3.0)
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_local(cfg: RunConfig, root: str | Path, *, timeout_s: float = 3600.0) -> Path:
    """A whole federation on this machine: SuperLink, one SuperNode per client, the run; returns the
    path of ``summary.json``. Every process is stopped when the run ends (or fails)."""
    with LocalFederation.for_run(root, cfg) as fed:
        assert fed.server is not None  # for_run started it
        run_id, status = fed.run(cfg, timeout_s=timeout_s)
        if status != "finished:completed":
            reason = getattr(status, "details", "")
            raise DeployError(
                f"run {run_id} ended as {status}"
                + (f": {reason}" if reason else "")
                + f"; see {Path(deployment_config(cfg).out) / 'server.log'} "
                f"and {fed.server.superlink.log_path}"
            )
    return Path(deployment_config(cfg).out) / "summary.json"


__all__ = ["LocalFederation", "run_local"]
