"""``trustformer deploy client``: one client's SuperNode, connected to the SuperLink over TLS with its key, its
log followed; a SuperLink that does not know the key yet is tried again for ``--wait-registration`` seconds."""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path
from typing import Any

from ..cli_options import setup_logging
from .following import follow_log, stop_on_sigterm

log = logging.getLogger(__name__)


def run_client(args: argparse.Namespace) -> int:
    from .launch import node_config

    setup_logging(quiet=False)
    folder = Path(args.dir)
    config = node_config(
        args.partition,
        folder / "state",
        folder / "output",
        args.train_file,
        trusted_key=args.trusted_key,
        expected_measurement=args.expected_measurement,
    )
    started = time.monotonic()
    try:
        with stop_on_sigterm() as stop:
            return _serve_client(args, folder, config, started)
    except KeyboardInterrupt:
        if not stop.requested:
            raise
        log.info("SuperNode of client %d stopped (SIGTERM)", args.partition)
        return 0  # a requested stop


def _serve_client(args: argparse.Namespace, folder: Path, config: dict[str, Any], started: float) -> int:
    from .launch import refused, start_supernode

    while True:
        proc = start_supernode(
            folder,
            args.superlink,
            args.ca,
            args.key,
            config,
            max_wait_s=args.give_up_after,
            name=f"SuperNode of client {args.partition}",
        )
        log.info(
            "SuperNode of client %d connecting to %s (TLS, key %s) · state %s · log %s",
            args.partition,
            args.superlink,
            args.key,
            folder / "state",
            proc.log_path,
        )
        position = int(proc.info["log_start"])
        try:
            while proc.alive():
                position = follow_log(proc.log_path, position)
                time.sleep(0.5)
            follow_log(proc.log_path, position)
        finally:
            if proc.alive():
                proc.stop()
        was_refused = refused(proc)
        if not was_refused or time.monotonic() - started > args.wait_registration:
            break
        log.warning(
            "the SuperLink refused this client (key not registered yet, or its previous instance "
            "still counts as online); trying again in 5 s"
        )
        time.sleep(5)
    code = proc.popen.returncode
    if was_refused:
        log.error(
            "the SuperLink refused key %s for %.0f s: is its public key registered on the server "
            "(trustformer deploy server --register KEY.pub, or flwr supernode register)?",
            args.key,
            args.wait_registration,
        )
    elif code not in (0, -signal.SIGTERM):
        log.error(
            "the SuperNode of client %d gave up (exit code %s)%s: is the SuperLink running at --superlink "
            "%s, and does --ca %s hold the CA that signed its certificate? See %s",
            args.partition,
            code,
            f" after --give-up-after {args.give_up_after:g} s without the SuperLink"
            if args.give_up_after is not None
            else "",
            args.superlink,
            args.ca,
            proc.log_path,
        )
    log.info("SuperNode of client %d exited (code %s)", args.partition, code)
    return 0 if code in (0, -signal.SIGTERM) else 1


__all__ = ["run_client"]
