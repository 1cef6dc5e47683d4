"""``trustformer attest``: print the aggregator's measurement for a configuration, so an operator
can pin it (``secure.expected_measurement``), and optionally write an attestation key pair."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..cli_options import add_config_options, resolve_config
from ..config import ConfigError
from ..secure.attestation import EMULATED_BACKEND, measured_config, measured_sources, measurement, write_key_pair


def add_attest_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attest",
        help="print the aggregator's measurement for a configuration (to pin with secure.expected_measurement)",
        description="Print the measurement a secure.mode=tee aggregator reports for this configuration: SHA-256 "
        "over the aggregator's source files and the protocol configuration it applies. The first line is the "
        "hex digest alone; clients pin it with --set secure.expected_measurement=HEX. Pass the same options as "
        "the run (--preset, --config, --strategy, --secure, --set ...). The TEE is a software emulation.",
    )
    add_config_options(p)
    p.add_argument(
        "--keygen",
        metavar="PREFIX",
        help="also write a new Ed25519 attestation key pair: PREFIX.key (the aggregator's, private, "
        "for secure.signing_key) and PREFIX.pub (the clients', for secure.trusted_key)",
    )
    p.add_argument("--json", action="store_true", help="print the measurement, files and configuration as JSON")
    p.set_defaults(func=_cmd_attest)


def _cmd_attest(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if args.keygen:
        existing = [p for p in (Path(f"{args.keygen}.key"), Path(f"{args.keygen}.pub")) if p.exists()]
        if existing:
            raise ConfigError(f"--keygen {args.keygen}: {existing[0]} exists; refusing to overwrite a key")
    digest = measurement(cfg)
    files = measured_sources()
    try:
        _print_measurement(args, cfg, digest, files)
    except BrokenPipeError:  # e.g. `trustformer attest ... | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.keygen:
        private_path, public_path = write_key_pair(args.keygen)
        print(
            f"# wrote {private_path} (aggregator: secure.signing_key) and {public_path} (clients: secure.trusted_key)",
            file=sys.stderr,
        )
    return 0


def _print_measurement(args, cfg, digest: str, files: list[str]) -> None:
    if args.json:
        print(
            json.dumps(
                {"measurement": digest, "backend": EMULATED_BACKEND, "files": files, "config": measured_config(cfg)},
                indent=2,
                sort_keys=True,
            )
        )
    else:
        print(digest)
        print(f"# backend: {EMULATED_BACKEND} (a software emulation of a TEE; see docs/privacy.md 'Secure exchange')")
        print(f"# code: {len(files)} files of the trustformer package: {', '.join(files)}")
        print(f"# configuration: {json.dumps(measured_config(cfg), sort_keys=True)}")
        print(f"# pin it on the clients with: --set secure.expected_measurement={digest}")
    sys.stdout.flush()
