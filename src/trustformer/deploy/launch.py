"""Start the pieces of a Flower deployment as processes, with Flower's own commands.

- the server side: ``flower-superlink`` (TLS on its one port for the Fleet, Control and Runtime
  APIs, ``--enable-supernode-auth``, ``--disable-runtime-dependency-installation``, state in a SQLite
  file), the clients' public keys registered with ``flwr supernode register``, the run submitted with
  ``flwr run`` (the ServerApp then runs in a process the SuperLink starts) and followed to its end;
- the client side: ``flower-supernode`` for one data owner (TLS, its private key, its node config:
  ``partition-id``, ``state-dir``, ``output-dir``, optional ``train-file``);
- the processes themselves (their environment, sessions, process trees, logs) are ``processes.py``'s;
  :class:`~trustformer.deploy.local.LocalFederation` (``local.py``) runs a server and N clients on
  127.0.0.1, for trying it out and for the tests.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from ..config import ConfigError, RunConfig, build_config
from .certs import Credentials, CredentialsError, check_public_key, local_runtime_tls
from .fab import write_app, write_run_config
from .processes import FLOWER_ENV, DeployError, Proc, flower_env, free_port, spawn, wait_for_port

log = logging.getLogger(__name__)

CONNECTION = "trustformer"  # the flwr CLI's name for the SuperLink connection
LOOPBACK = "127.0.0.1"


# ----------------------------------------------------------------------------------- server side


def start_superlink(
    home: str | Path,
    creds: Credentials,
    *,
    host: str = LOOPBACK,
    port: int | None = None,
    start_timeout_s: float = 90.0,
) -> Proc:
    """``flower-superlink`` with TLS and SuperNode authentication; state in ``<home>/superlink.db``."""
    creds.require_server()
    home = Path(home).resolve()
    port = port or free_port(host)
    check_port_free(host, port)
    command = [
        "flower-superlink",
        "--ssl-ca-certfile",
        str(creds.ca_cert.resolve()),
        "--ssl-certfile",
        str(creds.server_cert.resolve()),
        "--ssl-keyfile",
        str(creds.server_key.resolve()),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--database",
        str(home / "superlink.db"),
        "--host",
        host,
        "--port",
        str(port),
    ]
    proc = spawn("SuperLink", command, log_path=home / "superlink.log", home=home / "flwr-home", cwd=home)
    proc.info.update(host=host, port=port, address=f"{host}:{port}", home=home)
    try:
        wait_for_port(proc, host, port, start_timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc


def check_port_free(host: str, port: int) -> None:
    """DeployError naming ``--port`` when something already listens on ``host:port`` (checked before
    anything starts: Flower would otherwise report it later as an unavailable SuperLink)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed SuperLink's TIME_WAIT is no user
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise DeployError(
                f"port {port} on {host} is already in use ({exc.strerror}): another SuperLink or "
                "program listens there; stop it or choose another --port"
            ) from None


def preflight(cfg: RunConfig) -> None:
    """What a deployed run needs on the server, checked before any process starts: with ``secure.mode``
    tee the aggregator's signing key (``secure.signing_key``, readable, a private key)."""
    from ..secure.attestation import load_signing_key
    from ..secure.provision import uses_tee

    if uses_tee(cfg.secure.mode):
        if not cfg.secure.signing_key:
            raise DeployError(
                f"secure.mode = {cfg.secure.mode!r} needs the aggregator's attestation signing key: "
                "--set secure.signing_key=FILE.key (`trustformer attest --keygen PREFIX` writes a pair; "
                "give each client the .pub with `deploy client --trusted-key`)"
            )
        try:
            load_signing_key(cfg.secure.signing_key)
        except (OSError, ValueError) as exc:
            raise DeployError(f"secure.signing_key = {cfg.secure.signing_key}: {exc}") from None


def write_cli_connection(home: str | Path, address: str, ca_cert: str | Path) -> Path:
    """The flwr CLI's ``config.toml`` (under FLWR_HOME ``<home>/flwr-home``): the SuperLink connection."""
    flwr_home = Path(home).resolve() / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        tomli_w.dumps(
            {
                "superlink": {
                    "default": CONNECTION,
                    CONNECTION: {"address": address, "root-certificates": str(Path(ca_cert).resolve())},
                }
            }
        ),
        encoding="utf-8",
    )
    return path


def flwr_cli(home: str | Path, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run ``flwr ARGS --format json`` with the connection of ``<home>/flwr-home``; its JSON answer."""
    command = ["flwr", *args, "--format", "json"]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=flower_env(Path(home) / "flwr-home"),
            cwd=str(home),
        )
    except subprocess.TimeoutExpired:
        raise DeployError(f"`{' '.join(command)}` did not answer within {timeout_s:.0f} s") from None
    text = done.stdout
    start = text.find("{")
    try:
        answer = json.loads(text[start:]) if start >= 0 else {}
    except ValueError:
        answer = {}
    if done.returncode != 0 or not answer.get("success", False):
        detail = answer.get("error-message") or (done.stderr.strip() or text.strip())[-2000:]
        raise DeployError(f"`{' '.join(command)}` failed (exit {done.returncode}): {detail}")
    return answer


def register_node(home: str | Path, public_key: str | Path) -> int | None:
    """Register a SuperNode's public key on the SuperLink (``flwr supernode register``); its node id.

    A key the SuperLink already knows (its database outlived a restart) is left as it is: None.
    """
    key = check_public_key(public_key).resolve()
    try:
        answer = flwr_cli(home, "supernode", "register", str(key), CONNECTION)
    except DeployError as exc:
        if "already" in str(exc).lower():
            return None
        raise
    return int(answer["node-id"])


def submit_run(home: str | Path, cfg: RunConfig) -> int:
    """``flwr run`` the Trustformer app with ``cfg`` (written to ``<home>/run-config.toml``); the run id."""
    home = Path(home).resolve()
    app = write_app(home / "app")
    run_config = write_run_config(home / "run-config.toml", cfg)
    answer = flwr_cli(home, "run", str(app), CONNECTION, "--run-config", str(run_config))
    return int(answer["run-id"])


class RunStatus(str):
    """A run's status (pending, starting, running, finished:completed, finished:failed, ...) with
    ``details``: why it ended so, as the SuperLink recorded it (e.g. the ServerApp's exception)."""

    details: str = ""


def run_status(home: str | Path, run_id: int) -> RunStatus:
    """The run's status as ``flwr ls`` says it, with the SuperLink's status details (the failure reason)."""
    answer = flwr_cli(home, "ls", "--run-id", str(run_id), CONNECTION)
    runs = answer.get("runs", [])
    status = RunStatus(str(runs[0]["status"]) if runs else "unknown")
    status.details = str(runs[0].get("status-details", "") or "") if runs else ""
    return status


def wait_for_run(
    home: str | Path,
    run_id: int,
    summary: Path,
    *,
    submitted_at: float,
    timeout_s: float,
    status_every_s: float = 10.0,
    server: Proc | None = None,
) -> str:
    """Until the run finishes: ``summary`` written after ``submitted_at`` (then the final status), a
    failed or stopped status, the SuperLink gone, or ``timeout_s`` (DeployError)."""
    deadline = time.monotonic() + timeout_s
    next_status = time.monotonic() + status_every_s
    while True:
        if server is not None and not server.alive():
            raise DeployError(
                f"the SuperLink exited (code {server.popen.returncode}) before run {run_id} finished;"
                f" its log ({server.log_path}) ends with:\n{server.tail()}"
            )
        written = summary.exists() and summary.stat().st_mtime >= submitted_at
        if written or time.monotonic() >= next_status:
            status = run_status(home, run_id)
            if status.startswith("finished"):
                return status
            next_status = time.monotonic() + status_every_s
        if time.monotonic() >= deadline:
            raise DeployError(f"run {run_id} did not finish within {timeout_s:.0f} s")
        time.sleep(0.5)


def deployment_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with absolute paths (the ServerApp and ClientApps run in other working directories)."""
    if cfg.federation.faults:
        raise ConfigError(
            "federation.faults is applied by the in-process runtime only (trustformer run); "
            "a deployment's faults are real ones: remove federation.faults"
        )
    values = cfg.to_dict()
    values["out"] = str(Path(cfg.out).resolve())
    for key in ("path", "cache_dir"):
        if values["data"].get(key):
            values["data"][key] = str(Path(values["data"][key]).expanduser().resolve())
    return build_config(values)


@dataclass
class ServerSide:
    """A running SuperLink with the flwr CLI set up to talk to it."""

    home: Path
    creds: Credentials
    superlink: Proc

    @property
    def address(self) -> str:
        return str(self.superlink.info["address"])

    def register(self, public_keys: list[Path]) -> dict[str, int | None]:
        """Register node public keys; ``{key file name: node id}`` (None: already registered)."""
        return {Path(k).name: register_node(self.home, k) for k in public_keys}

    def run(self, cfg: RunConfig, *, timeout_s: float = 3600.0) -> tuple[int, str]:
        """Submit ``cfg`` and wait for the run to finish; ``(run id, final status)``."""
        cfg = deployment_config(cfg)
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        submitted = time.time() - 1.0  # file times may be coarser than the clock
        run_id = submit_run(self.home, cfg)
        log.info("run %d submitted · output %s", run_id, cfg.out)
        status = wait_for_run(
            self.home,
            run_id,
            Path(cfg.out) / "summary.json",
            submitted_at=submitted,
            timeout_s=timeout_s,
            server=self.superlink,
        )
        return run_id, status

    def stop(self) -> None:
        self.superlink.stop()


def start_server(
    home: str | Path,
    creds: Credentials,
    *,
    host: str = LOOPBACK,
    port: int | None = None,
    public_keys: list[Path] | None = None,
) -> ServerSide:
    """Start the SuperLink, point the flwr CLI at it and register the given node public keys."""
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    superlink = start_superlink(home, creds, host=host, port=port)
    try:
        connect_host = LOOPBACK if host in ("0.0.0.0", "::") else host
        write_cli_connection(home, f"{connect_host}:{superlink.info['port']}", creds.ca_cert)
        server = ServerSide(home, creds, superlink)
        if public_keys:
            server.register(public_keys)
    except BaseException:
        superlink.stop()
        raise
    return server


# ----------------------------------------------------------------------------------- client side


def node_config(
    partition: int,
    state_dir: str | Path,
    output_dir: str | Path | None = None,
    train_file: str | Path | None = None,
    *,
    trusted_key: str | Path | None = None,
    expected_measurement: str | None = None,
    pins: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A data owner's node config: which client it is, where its state and translations go, and its
    own trust anchors for ``secure.mode = tee`` (``trusted_key``: the aggregator's public key, a file on
    this machine; ``expected_measurement``: the measurement it requires; or ``pins`` as made by
    ``secure.provision.client_pins``)."""
    from ..secure.attestation import load_trusted_key
    from ..secure.provision import MEASUREMENT_NODE_CONFIG, TRUSTED_KEY_NODE_CONFIG

    config: dict[str, Any] = {
        "partition-id": int(partition),
        "state-dir": str(Path(state_dir).resolve()),
        "diagnostics": False,
    }
    config.update(pins or {})
    if trusted_key is not None:
        path = Path(trusted_key).expanduser().resolve()
        try:
            load_trusted_key(path)
        except (OSError, ValueError) as exc:
            raise DeployError(f"--trusted-key {trusted_key}: {exc}") from None
        config[TRUSTED_KEY_NODE_CONFIG] = str(path)
    if expected_measurement is not None:
        value = expected_measurement.strip().lower()
        if len(value) != 64 or set(value) - set("0123456789abcdef"):
            raise DeployError(
                f"--expected-measurement {expected_measurement!r}: expected 64 hex digits, the first "
                "line of `trustformer attest` with the run's options"
            )
        config[MEASUREMENT_NODE_CONFIG] = value
    if output_dir is not None:
        config["output-dir"] = str(Path(output_dir).resolve())
    if train_file is not None:
        path = Path(train_file).resolve()
        if not path.is_file():
            raise DeployError(f"--train-file {train_file}: no such file")
        config["train-file"] = str(path)
    return config


def start_supernode(
    home: str | Path,
    superlink: str,
    ca_cert: str | Path,
    private_key: str | Path,
    config: dict[str, Any],
    *,
    runtime_port: int | None = None,
    max_wait_s: float | None = None,
    name: str = "SuperNode",
) -> Proc:
    """``flower-supernode`` for one client: TLS to ``superlink`` (host:port), authenticated with
    ``private_key``, node config from ``<home>/node-config.toml``, log ``<home>/supernode.log``; its
    own Runtime API on 127.0.0.1 (to its ClientApp processes) is TLS too, with credentials of this
    machine's own in ``<home>/runtime-tls``."""
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    key = Path(private_key)
    if not key.is_file():
        raise CredentialsError(f"node private key {key} does not exist (--key)")
    if not Path(ca_cert).is_file():
        raise CredentialsError(f"CA certificate {ca_cert} does not exist (--ca: the federation's ca.crt)")
    node_file = home / "node-config.toml"
    node_file.write_text(tomli_w.dumps(config), encoding="utf-8")
    port = runtime_port or free_port()
    runtime = local_runtime_tls(home / "runtime-tls")
    log_path = home / "supernode.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0
    command = [
        "flower-supernode",
        "--superlink",
        superlink,
        "--root-certificates",
        str(Path(ca_cert).resolve()),
        "--auth-supernode-private-key",
        str(key.resolve()),
        "--node-config",
        str(node_file),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--ssl-certfile",
        str(runtime.server_cert),
        "--ssl-keyfile",
        str(runtime.server_key),
        "--ssl-ca-certfile",
        str(runtime.ca_cert),
    ]
    if max_wait_s is not None:
        command += ["--max-wait-time", str(max_wait_s)]
    proc = spawn(name, command, log_path=log_path, home=home / "flwr-home", cwd=home)
    proc.info.update(runtime_port=port, home=home, config=config, log_start=log_start)
    return proc


REFUSED = b"Failed to activate SuperNode"  # what flower-supernode logs when the SuperLink refuses it
CONNECTED = b"SuperNode ID:"  # ... and once the SuperLink accepted it
RETRY_S = 5.0


def _log_since_start(proc: Proc) -> bytes:
    try:
        return proc.log_path.read_bytes()[int(proc.info.get("log_start", 0)) :]
    except OSError:
        return b""


def refused(proc: Proc) -> bool:
    """Whether the SuperLink refused this SuperNode (unregistered key, or its node still online)."""
    return REFUSED in _log_since_start(proc)


def connection_outcome(proc: Proc) -> str:
    """``connected``, ``exited`` or ``pending`` for a SuperNode process."""
    if CONNECTED in _log_since_start(proc):
        return "connected"
    return "pending" if proc.alive() else "exited"


__all__ = [
    "CONNECTION",
    "DeployError",
    "FLOWER_ENV",
    "LOOPBACK",
    "Proc",
    "ServerSide",
    "check_port_free",
    "connection_outcome",
    "deployment_config",
    "flower_env",
    "flwr_cli",
    "free_port",
    "node_config",
    "preflight",
    "refused",
    "register_node",
    "spawn",
    "start_server",
    "start_superlink",
    "start_supernode",
    "submit_run",
    "wait_for_run",
    "write_cli_connection",
]
