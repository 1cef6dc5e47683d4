"""What one user running both sides in one process hands out of band: the aggregator's attestation key and the
clients' trust anchors (``secure.mode`` with ``tee``), and, as a simulation-only diagnostic, the plain inputs of
secure aggregation (to measure its quantisation error against the exact mean)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..config import RunConfig
from .attestation import generate_signing_key, load_signing_key, measurement, public_key_hex

# The client's own trust anchors live in its node config (set by the client: `trustformer deploy client
# --trusted-key/--expected-measurement`, or the in-process runtime), never in the run config the server submits.
PUBLIC_KEY_NODE_CONFIG = "attestation-public-key"  # node_config entry: the aggregator's attestation key (hex)
TRUSTED_KEY_NODE_CONFIG = "trusted-key"  # node_config entry: a file on the client's machine holding that key
MEASUREMENT_NODE_CONFIG = "expected-measurement"  # node_config entry: the aggregator measurement the client requires

signing_keys: dict[int, tuple[Any, str]] = {}  # run id -> (aggregator's signing key, where it came from)
plain_vectors: dict[tuple[int, int], dict[int, np.ndarray]] = {}  # simulation only: secagg inputs in clear


def uses_tee(mode: str) -> bool:
    return mode in ("tee", "tee+secagg")


def uses_secagg(mode: str) -> bool:
    return mode in ("secagg", "tee+secagg")


def client_pins(cfg: RunConfig, signing_key=None) -> dict[str, str]:
    """The node config entries pinning a client's trust anchors when one user runs both sides (the
    in-process runtime, ``deploy local``): ``secure.trusted_key`` (or the public half of ``signing_key``)
    and ``secure.expected_measurement`` (or the measurement of ``cfg`` computed here)."""
    pins = {MEASUREMENT_NODE_CONFIG: cfg.secure.expected_measurement or measurement(cfg)}
    if cfg.secure.trusted_key:
        pins[TRUSTED_KEY_NODE_CONFIG] = str(cfg.secure.trusted_key)
    elif signing_key is not None:
        pins[PUBLIC_KEY_NODE_CONFIG] = public_key_hex(signing_key)
    return pins


@contextlib.contextmanager
def provisioned(cfg: RunConfig, run_id: int, nodes: list[dict[str, Any]]) -> Iterator[None]:
    """For one in-process run: with ``tee``, the aggregator gets its signing key and the clients their pins
    (the aggregator's public key and the measurement they require), added to ``nodes``; released at the end.

    Without ``secure.signing_key`` the key pair is generated for this run only (the summary says so).
    """
    if uses_tee(cfg.secure.mode):
        if cfg.secure.signing_key:
            key, origin = load_signing_key(cfg.secure.signing_key), f"file {cfg.secure.signing_key}"
        else:
            key, origin = generate_signing_key(), "generated for this run by the in-process runtime"
        signing_keys[run_id] = (key, origin)
        for node in nodes:
            for name, value in client_pins(cfg, key).items():
                node.setdefault(name, value)
    try:
        yield
    finally:
        signing_keys.pop(run_id, None)
        for vector_key in [k for k in plain_vectors if k[0] == run_id]:
            del plain_vectors[vector_key]


__all__ = [
    "MEASUREMENT_NODE_CONFIG",
    "PUBLIC_KEY_NODE_CONFIG",
    "TRUSTED_KEY_NODE_CONFIG",
    "client_pins",
    "plain_vectors",
    "provisioned",
    "signing_keys",
    "uses_secagg",
    "uses_tee",
]
