"""``trustformer deploy ...``: credentials, the server side, a client side, a whole local federation."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from ..cli_options import add_config_options, run_config, setup_logging
from ..config import ConfigError, RunConfig
from .client_command import run_client
from .following import follow_log, stop_on_sigterm

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092


def add_deploy_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``trustformer deploy`` and its subcommands."""
    p = sub.add_parser(
        "deploy",
        help="run a federation as separate processes or machines on Flower's runtime (SuperLink + SuperNodes)",
        description="Multi-process deployment on Flower's own runtime, with TLS on every connection and "
        "SuperNode authentication with registered keys. See docs/deployment.md.",
    )
    d = p.add_subparsers(dest="deploy_command", required=True)

    c = d.add_parser(
        "certs",
        help="make a CA, the SuperLink's TLS certificate and client key pairs",
        description="Write ca.crt/ca.key, server.crt/server.key (for the given hosts) and "
        "nodes/client-<i>.key/.pub (SuperNode authentication keys) into --out.",
    )
    c.add_argument("--out", required=True, metavar="DIR", help="credentials folder")
    c.add_argument("--clients", type=int, default=3, help="client key pairs to make (default 3)")
    c.add_argument(
        "--host",
        action="append",
        metavar="NAME_OR_IP",
        help="a host name or IP address the SuperLink is reached at (repeatable; default 127.0.0.1 and localhost)",
    )
    c.add_argument("--days", type=int, default=365, help="validity of the certificates (default 365)")
    c.add_argument("--force", action="store_true", help="replace the credentials already in --out")
    c.set_defaults(func=_cmd_certs)

    k = d.add_parser("key", help="make one SuperNode key pair (a data owner keeps the .key, sends the .pub)")
    k.add_argument("--out", required=True, metavar="DIR", help="where to write NAME.key and NAME.pub")
    k.add_argument("--name", required=True, help="file name, e.g. client-3")
    k.set_defaults(func=_cmd_key)

    s = d.add_parser(
        "server",
        help="SuperLink + the Trustformer run: waits for the run, prints summary.json",
        description="Start a SuperLink (TLS, SuperNode authentication), register the clients' "
        "public keys, submit the run with `flwr run` and wait for it to finish; then stop.",
    )
    add_config_options(s)
    s.add_argument("--creds", required=True, metavar="DIR", help="credentials folder (trustformer deploy certs)")
    s.add_argument(
        "--register",
        action="append",
        metavar="KEY.pub",
        help="a client public key to register (repeatable; default: every DIR/nodes/*.pub)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the SuperLink listens on (default 127.0.0.1; 0.0.0.0 for other machines)",
    )
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"its port (default {DEFAULT_PORT})")
    s.add_argument("--dir", metavar="DIR", help="SuperLink database, logs, app (default: <out>/superlink)")
    _add_run_options(s)
    s.set_defaults(func=_cmd_server)

    n = d.add_parser(
        "client",
        help="a SuperNode for one data owner (runs until stopped)",
        description="Start a SuperNode that connects to the SuperLink over TLS, authenticates "
        "with its private key and runs the Trustformer ClientApp for one client's data.",
    )
    n.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's address")
    n.add_argument("--ca", required=True, metavar="CA.crt", help="the federation's CA certificate")
    n.add_argument("--key", required=True, metavar="NAME.key", help="this client's private key")
    n.add_argument(
        "--partition",
        type=int,
        required=True,
        help="which client this is: its shard of the configured corpus, its seeds, its id in the results",
    )
    n.add_argument("--dir", required=True, metavar="DIR", help="this client's folder: state/, output/, logs")
    n.add_argument(
        "--train-file",
        metavar="FILE.tsv",
        help="train on this TSV of the client's own pairs instead of its shard of the corpus",
    )
    n.add_argument(
        "--trusted-key",
        metavar="FILE.pub",
        help="secure.mode tee: the aggregator's attestation public key, a file on this machine "
        "(trustformer attest --keygen writes it); the run config's secure.trusted_key is ignored",
    )
    n.add_argument(
        "--expected-measurement",
        metavar="HEX",
        help="secure.mode tee: the aggregator measurement this client requires (the first line of "
        "`trustformer attest` with the run's options); the run config's value is ignored",
    )
    n.add_argument(
        "--give-up-after",
        type=float,
        default=600.0,
        metavar="S",
        help="exit, saying which options to check (--superlink, --ca), when the SuperLink has been "
        "unreachable this many seconds (default 600)",
    )
    n.add_argument(
        "--wait-registration",
        type=float,
        default=300.0,
        metavar="S",
        help="while the SuperLink refuses this client's key (not registered yet), try again for "
        "up to S seconds (default 300)",
    )
    n.set_defaults(func=run_client)

    loc = d.add_parser(
        "local",
        help="a whole federation on this machine: server and N clients as processes",
        description="Make credentials, start a SuperLink and one SuperNode per client on 127.0.0.1 "
        "(free ports), run, wait, print where summary.json is, and stop every process.",
    )
    add_config_options(loc)
    loc.add_argument("--dir", metavar="DIR", help="credentials, logs, client state (default: <out>/deployment)")
    _add_run_options(loc)
    loc.set_defaults(func=_cmd_local)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run checkpointed in RUN_DIR (its own configuration; --set may change "
        "runtime.* and federation timeouts only)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=24 * 3600.0,
        metavar="S",
        help="give up when the run has not finished after S seconds (default 1 day)",
    )
    p.add_argument("--quiet", action="store_true", help="only warnings and the final line")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in the output folder (a finished or interrupted run there is otherwise refused)",
    )


def _refuse_existing_run(cfg: RunConfig, args: argparse.Namespace, command: str) -> None:
    """A new run into a folder that holds one would replace its summary, metrics and checkpoint without a word."""
    if cfg.runtime.resume or args.overwrite:
        return
    folder = Path(cfg.out)
    if (folder / "summary.json").exists():
        raise ConfigError(
            f"{folder} holds a finished run (summary.json, its metrics and model): choose another folder with "
            "--out DIR, or pass --overwrite to replace it"
        )
    if (folder / "checkpoint.json").exists():
        raise ConfigError(
            f"{folder} holds an interrupted run (checkpoint.json): continue it with 'trustformer deploy {command} "
            f"--resume {folder}', choose another folder with --out DIR, or pass --overwrite to replace it"
        )


def _cmd_certs(args: argparse.Namespace) -> int:
    from .certs import DEFAULT_HOSTS, write_credentials

    hosts = tuple(args.host) if args.host else DEFAULT_HOSTS
    creds = write_credentials(args.out, clients=args.clients, hosts=hosts, days=args.days, overwrite=args.force)
    print(
        f"CA {creds.ca_cert} · SuperLink certificate {creds.server_cert} for {', '.join(hosts)} · "
        f"{len(creds.public_keys())} client key pair(s) in {creds.nodes_dir}"
    )
    return 0


def _cmd_key(args: argparse.Namespace) -> int:
    from .certs import write_node_key

    private, public = write_node_key(args.out, args.name)
    print(f"private key {private} (stays with the client) · public key {public} (register it on the SuperLink)")
    return 0


def _cmd_server(args: argparse.Namespace) -> int:
    from .certs import Credentials
    from .launch import check_port_free, deployment_config, preflight, start_server

    cfg = deployment_config(run_config(args))
    _refuse_existing_run(cfg, args, "server")
    preflight(cfg)
    check_port_free(args.host, args.port)
    setup_logging(quiet=args.quiet or not cfg.runtime.progress)
    creds = Credentials(Path(args.creds)).require_server()
    keys = [Path(k) for k in args.register] if args.register else creds.public_keys()
    home = Path(args.dir) if args.dir else Path(cfg.out) / "superlink"
    with stop_on_sigterm():
        server = start_server(home, creds, host=args.host, port=args.port, public_keys=keys)
        try:
            log.info(
                "SuperLink listening on %s:%d (TLS, SuperNode authentication) · %d client key(s) registered · log %s",
                args.host,
                args.port,
                len(keys),
                server.superlink.log_path,
            )
            run_id, status = _submit_and_follow(server, cfg, args.timeout, quiet=args.quiet)
        finally:
            server.stop()
    return _finish(status, run_id, cfg, server.superlink)


def _cmd_local(args: argparse.Namespace) -> int:
    from ..tasks.run import load_task
    from .launch import deployment_config, preflight
    from .local import LocalFederation

    cfg = deployment_config(run_config(args))
    _refuse_existing_run(cfg, args, "local")
    preflight(cfg)
    setup_logging(quiet=args.quiet or not cfg.runtime.progress)
    load_task(cfg)  # corpus and tokenizer (image data) built (and cached) here once, not by every client at once
    root = Path(args.dir) if args.dir else Path(cfg.out) / "deployment"
    with stop_on_sigterm(), LocalFederation.for_run(root, cfg) as fed:
        assert fed.server is not None  # for_run started it
        log.info(
            "SuperLink on %s (TLS, SuperNode authentication) · log %s · %d SuperNode(s), logs %s",
            fed.server.address,
            fed.server.superlink.log_path,
            len(fed.nodes) + len(fed.others),
            root / "client-*" / "supernode.log",
        )
        run_id, status = _submit_and_follow(fed.server, cfg, args.timeout, quiet=args.quiet)
    return _finish(status, run_id, cfg, fed.server.superlink)


def _submit_and_follow(server, cfg: RunConfig, timeout_s: float, *, quiet: bool) -> tuple[int, str]:
    """Submit the run, then wait for it, echoing the ServerApp's progress (``<out>/server.log``)."""
    import threading

    from .launch import submit_run, wait_for_run

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    server_log = out / "server.log"
    start = server_log.stat().st_size if server_log.exists() else 0
    submitted = time.time() - 1.0  # file times may be coarser than the clock
    run_id = submit_run(server.home, cfg)
    log.info("run %d submitted · output %s", run_id, out)
    done = threading.Event()

    def follow() -> None:
        position = start
        while not done.is_set():
            position = follow_log(server_log, position)
            done.wait(0.5)
        follow_log(server_log, position)

    thread = threading.Thread(target=follow, daemon=True)
    if not quiet:
        thread.start()
    try:
        status = wait_for_run(
            server.home,
            run_id,
            out / "summary.json",
            submitted_at=submitted,
            timeout_s=timeout_s,
            server=server.superlink,
        )
    finally:
        done.set()
        if thread.is_alive():
            thread.join(timeout=2)
    return run_id, status


def _finish(status: str, run_id: int, cfg: RunConfig, superlink) -> int:
    from .launch import DeployError

    summary = Path(cfg.out) / "summary.json"
    if status != "finished:completed":
        reason = getattr(status, "details", "")
        raise DeployError(
            f"run {run_id} ended as {status}"
            + (f": {reason}" if reason else "")
            + f"; see {Path(cfg.out) / 'server.log'} and {superlink.log_path}"
        )
    print(f"run {run_id} finished · {summary}")
    return 0


__all__ = ["add_deploy_parser"]
