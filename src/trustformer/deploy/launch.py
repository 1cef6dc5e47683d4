"""Start the pieces of a Flower deployment as processes, with Flower's own commands.

- the server side: ``flower-superlink`` (TLS on its one port for the Fleet, Control and Runtime
  APIs, ``--enable-supernode-auth``, ``--disable-runtime-dependency-installation``, state in a SQLite
  file), the clients' public keys registered with ``flwr supernode register``, the run submitted with
  ``flwr run`` (the ServerApp then runs in a process the SuperLink starts) and followed to its end;
- the client side: ``flower-supernode`` for one data owner (TLS, its private key, its node config:
  ``partition-id``, ``state-dir``, ``output-dir``, optional ``train-file``);
- :class:`LocalFederation`: a server and N clients as processes on 127.0.0.1, for trying it out and
  for the tests.

Every Flower process gets ``FLWR_TELEMETRY_ENABLED=0``, ``FLWR_DISABLE_UPDATE_CHECK=1`` and its own
``FLWR_HOME`` (where Flower installs the app bundle and the CLI keeps its connection settings).
Processes start in sessions of their own; stopping one stops its whole process tree.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..config import ConfigError, RunConfig, build_config
from .certs import Credentials, CredentialsError, check_public_key, local_runtime_tls, write_credentials
from .fab import write_app, write_run_config

log = logging.getLogger(__name__)

FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
CONNECTION = "trustformer"  # the flwr CLI's name for the SuperLink connection
LOOPBACK = "127.0.0.1"


class DeployError(RuntimeError):
    """A deployment process failed to start, a Flower command failed, or a run did not finish."""


# ----------------------------------------------------------------------------------- processes


def flower_env(home: str | Path | None = None) -> dict[str, str]:
    """This process's environment plus the Flower settings (telemetry and update check off, FLWR_HOME)."""
    env = dict(os.environ)
    env.update(FLOWER_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    # Flower's commands (and the flwr-serverapp / flwr-clientapp processes they start) from this
    # Python's environment, e.g. a virtualenv that is not activated, before anything else on PATH
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts] + [d for d in env.get("PATH", "").split(os.pathsep) if d and d != scripts])
    if home is not None:
        env["FLWR_HOME"] = str(Path(home).resolve())
    return env


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free right now on ``host`` (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc; elsewhere only ``pid``)."""
    children = _children_map()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


@dataclass
class Proc:
    """A process this module started, its log file and its role."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal_tree(self, sig: int) -> list[int]:
        """Send ``sig`` to the process and every descendant (collected first: children outlive parents)."""
        pids = process_tree(self.pid) if self.alive() else []
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill(self) -> None:
        """SIGKILL the whole tree now (a crash, as far as the others can tell)."""
        self.signal_tree(signal.SIGKILL)
        self._reap()

    def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM the tree, then SIGKILL what is left after ``grace_s`` seconds."""
        pids = self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_exists(p) for p in pids):
            self.popen.poll()
            time.sleep(0.1)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap()

    def _reap(self) -> None:
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL always ends it
            pass


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _die_with_parent() -> None:
    """In the child before exec (Linux): receive SIGTERM when the process that started it dies, even
    by SIGKILL, so no Flower process outlives the command or test that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_GROUP_REAPER = """
import os, signal, sys, time
group, parent = int(sys.argv[1]), int(sys.argv[2])
def alive():
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
def end():
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
while alive():
    if os.getppid() != parent:
        end()
        break
    time.sleep(0.3)
"""
"""The reaper of one spawned process group: once the process that spawned the group is gone (even by
SIGKILL: the reaper is then re-parented, which it checks every 0.3 s) it ends the whole group,
grandchildren included — e.g. the ``flwr-serverapp`` a SuperLink starts, which a death signal on the
SuperLink alone would leave behind. It exits by itself once the group is gone."""


def spawn(name: str, command: list[str], *, log_path: Path, home: Path, cwd: Path | None = None) -> Proc:
    """Start ``command`` in a session of its own, stdout and stderr to ``log_path``. On Linux every
    process of that session dies with the process that called this (``_GROUP_REAPER``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    # the death signal follows the thread that forks: only from the main thread, which lives as long as we do
    tie = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
    with log_path.open("ab") as out:
        popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=flower_env(home), cwd=str(cwd or home), start_new_session=True,
                                 preexec_fn=_die_with_parent if tie else None)
    if tie:  # the group's own session id is the child's pid (start_new_session)
        subprocess.Popen([sys.executable, "-c", _GROUP_REAPER, str(popen.pid), str(os.getpid())],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log.debug("started %s (pid %d): %s", name, popen.pid, " ".join(command))
    return Proc(name, popen, log_path)


def wait_for_port(proc: Proc, host: str, port: int, timeout_s: float) -> None:
    """Until something listens on ``host:port``; DeployError if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise DeployError(f"{proc.name} exited with code {proc.popen.returncode}; its log "
                              f"({proc.log_path}) ends with:\n{proc.tail()}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise DeployError(f"{proc.name} did not listen on {host}:{port} within {timeout_s:.0f} s; "
                      f"its log ({proc.log_path}) ends with:\n{proc.tail()}")


# ----------------------------------------------------------------------------------- server side


def start_superlink(home: str | Path, creds: Credentials, *, host: str = LOOPBACK, port: int | None = None,
                    start_timeout_s: float = 90.0) -> Proc:
    """``flower-superlink`` with TLS and SuperNode authentication; state in ``<home>/superlink.db``."""
    creds.require_server()
    home = Path(home).resolve()
    port = port or free_port(host)
    check_port_free(host, port)
    command = [
        "flower-superlink",
        "--ssl-ca-certfile", str(creds.ca_cert.resolve()),
        "--ssl-certfile", str(creds.server_cert.resolve()),
        "--ssl-keyfile", str(creds.server_key.resolve()),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--database", str(home / "superlink.db"),
        "--host", host, "--port", str(port),
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
            raise DeployError(f"port {port} on {host} is already in use ({exc.strerror}): another SuperLink or "
                              "program listens there; stop it or choose another --port") from None


def preflight(cfg: RunConfig) -> None:
    """What a deployed run needs on the server, checked before any process starts: with ``secure.mode``
    tee the aggregator's signing key (``secure.signing_key``, readable, a private key)."""
    from ..secure.attestation import load_signing_key
    from ..secure.provision import uses_tee

    if uses_tee(cfg.secure.mode):
        if not cfg.secure.signing_key:
            raise DeployError(f"secure.mode = {cfg.secure.mode!r} needs the aggregator's attestation signing key: "
                              "--set secure.signing_key=FILE.key (`trustformer attest --keygen PREFIX` writes a pair; "
                              "give each client the .pub with `deploy client --trusted-key`)")
        try:
            load_signing_key(cfg.secure.signing_key)
        except (OSError, ValueError) as exc:
            raise DeployError(f"secure.signing_key = {cfg.secure.signing_key}: {exc}") from None


def write_cli_connection(home: str | Path, address: str, ca_cert: str | Path) -> Path:
    """The flwr CLI's ``config.toml`` (under FLWR_HOME ``<home>/flwr-home``): the SuperLink connection."""
    flwr_home = Path(home).resolve() / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {
        "default": CONNECTION,
        CONNECTION: {"address": address, "root-certificates": str(Path(ca_cert).resolve())},
    }}), encoding="utf-8")
    return path


def flwr_cli(home: str | Path, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run ``flwr ARGS --format json`` with the connection of ``<home>/flwr-home``; its JSON answer."""
    command = ["flwr", *args, "--format", "json"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=flower_env(Path(home) / "flwr-home"), cwd=str(home))
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


def wait_for_run(home: str | Path, run_id: int, summary: Path, *, submitted_at: float, timeout_s: float,
                 status_every_s: float = 10.0, server: Proc | None = None) -> str:
    """Until the run finishes: ``summary`` written after ``submitted_at`` (then the final status), a
    failed or stopped status, the SuperLink gone, or ``timeout_s`` (DeployError)."""
    deadline = time.monotonic() + timeout_s
    next_status = time.monotonic() + status_every_s
    while True:
        if server is not None and not server.alive():
            raise DeployError(f"the SuperLink exited (code {server.popen.returncode}) before run {run_id} finished;"
                              f" its log ({server.log_path}) ends with:\n{server.tail()}")
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
        raise ConfigError("federation.faults is applied by the in-process runtime only (trustformer run); "
                          "a deployment's faults are real ones: remove federation.faults")
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
        status = wait_for_run(self.home, run_id, Path(cfg.out) / "summary.json", submitted_at=submitted,
                              timeout_s=timeout_s, server=self.superlink)
        return run_id, status

    def stop(self) -> None:
        self.superlink.stop()


def start_server(home: str | Path, creds: Credentials, *, host: str = LOOPBACK, port: int | None = None,
                 public_keys: list[Path] | None = None) -> ServerSide:
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


def node_config(partition: int, state_dir: str | Path, output_dir: str | Path | None = None,
                train_file: str | Path | None = None, *, trusted_key: str | Path | None = None,
                expected_measurement: str | None = None, pins: dict[str, str] | None = None) -> dict[str, Any]:
    """A data owner's node config: which client it is, where its state and translations go, and its
    own trust anchors for ``secure.mode = tee`` (``trusted_key``: the aggregator's public key, a file on
    this machine; ``expected_measurement``: the measurement it requires; or ``pins`` as made by
    ``secure.provision.client_pins``)."""
    from ..secure.attestation import load_trusted_key
    from ..secure.provision import MEASUREMENT_NODE_CONFIG, TRUSTED_KEY_NODE_CONFIG

    config: dict[str, Any] = {"partition-id": int(partition), "state-dir": str(Path(state_dir).resolve()),
                              "diagnostics": False}
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
            raise DeployError(f"--expected-measurement {expected_measurement!r}: expected 64 hex digits, the first "
                              "line of `trustformer attest` with the run's options")
        config[MEASUREMENT_NODE_CONFIG] = value
    if output_dir is not None:
        config["output-dir"] = str(Path(output_dir).resolve())
    if train_file is not None:
        path = Path(train_file).resolve()
        if not path.is_file():
            raise DeployError(f"--train-file {train_file}: no such file")
        config["train-file"] = str(path)
    return config


def start_supernode(home: str | Path, superlink: str, ca_cert: str | Path, private_key: str | Path,
                    config: dict[str, Any], *, runtime_port: int | None = None, max_wait_s: float | None = None,
                    name: str = "SuperNode") -> Proc:
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
        "--superlink", superlink,
        "--root-certificates", str(Path(ca_cert).resolve()),
        "--auth-supernode-private-key", str(key.resolve()),
        "--node-config", str(node_file),
        "--host", LOOPBACK, "--port", str(port),
        "--ssl-certfile", str(runtime.server_cert), "--ssl-keyfile", str(runtime.server_key),
        "--ssl-ca-certfile", str(runtime.ca_cert),
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
        return proc.log_path.read_bytes()[int(proc.info.get("log_start", 0)):]
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


# ----------------------------------------------------------------------------------- one machine


class LocalFederation:
    """A SuperLink and N SuperNodes as processes on 127.0.0.1, all under one folder::

        <root>/creds/        CA, server certificate, node keys (made if missing)
        <root>/server/       SuperLink database, log, flwr CLI settings, the app folder
        <root>/client-<i>/   a SuperNode: its log, node config, state/ and output/

    Use as a context manager: leaving it stops every process it started.
    """

    def __init__(self, root: str | Path, clients: int, *, creds: Credentials | None = None,
                 extra_keys: tuple[str, ...] = ()) -> None:
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

    def start_client(self, partition: int, *, key_name: str | None = None,
                     train_file: str | Path | None = None, retry_refused_s: float = 0.0) -> Proc:
        """Start client ``partition``'s SuperNode (key ``client-<partition>`` unless ``key_name``).

        ``retry_refused_s``: while the SuperLink refuses the node (a SuperNode restarted after a
        crash is refused until its old instance misses its heartbeats, up to a minute), start it
        again every few seconds, for up to that long (in a background thread)."""
        assert self.server is not None, "start_server first"
        folder = self.client_dir(partition) if key_name is None else self.root / key_name
        config = node_config(partition, folder / "state", folder / "output", train_file, pins=self.pins)

        def start() -> Proc:
            assert self.server is not None
            proc = start_supernode(folder, self.server.address, self.creds.ca_cert,
                                   self.creds.node_key(key_name or f"client-{partition}"), config,
                                   name=f"SuperNode of client {partition}")
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
                        log.info("%s refused (its old instance still counts as online); trying again",
                                 current.name)
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
    def for_run(cls, root: str | Path, cfg: RunConfig) -> "LocalFederation":
        """A started federation for ``cfg``: the SuperLink and one SuperNode per client (centralized:
        one holding every shard). Stops what it started if starting fails."""
        from ..runtime.server import expected_nodes
        from ..secure.attestation import load_signing_key
        from ..secure.provision import client_pins, uses_tee
        from ..core.shared import ALL_SHARDS

        fed = cls(root, expected_nodes(cfg))
        if uses_tee(cfg.secure.mode):
            fed.pins = client_pins(cfg, load_signing_key(cfg.secure.signing_key) if cfg.secure.signing_key else None)
        try:
            fed.start_server()
            if cfg.federation.strategy == "centralized":
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

    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_local(cfg: RunConfig, root: str | Path, *, timeout_s: float = 3600.0) -> Path:
    """A whole federation on this machine: SuperLink, one SuperNode per client, the run; returns the
    path of ``summary.json``. Every process is stopped when the run ends (or fails)."""
    with LocalFederation.for_run(root, cfg) as fed:
        run_id, status = fed.run(cfg, timeout_s=timeout_s)
        if status != "finished:completed":
            reason = getattr(status, "details", "")
            raise DeployError(f"run {run_id} ended as {status}" + (f": {reason}" if reason else "") + "; see {Path(deployment_config(cfg).out) / 'server.log'} "
                              f"and {fed.server.superlink.log_path}")
    return Path(deployment_config(cfg).out) / "summary.json"


__all__ = ["DeployError", "LocalFederation", "Proc", "ServerSide", "deployment_config", "flower_env", "free_port",
           "node_config", "register_node", "run_local", "start_server", "start_superlink", "start_supernode",
           "submit_run", "wait_for_run", "write_cli_connection"]
