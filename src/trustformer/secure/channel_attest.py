"""The aggregator's attestation on the secure channel (``tee``, ``tee+secagg``; module docstring of ``channel.py``):
before round 1 the emulated TEE's backend is started and every client verifies its signed quote; a client seen
for the first time later attests when it joins."""

from __future__ import annotations

import logging
import time
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from .attestation import AttestationError, load_signing_key, measurement, public_key_hex
from .channel_errors import SecureChannelError
from .provision import signing_keys
from .tee import SoftwareTEE

log = logging.getLogger(__name__)


def start_tee(link: Any, nodes: list[int], needed: int) -> None:
    """The secure link's TEE backend, with the attestation signing key of the run; then every client in ``nodes``
    attests it (round 0); fewer than ``needed`` attested clients stop the run."""
    sec = link.cfg.secure
    if sec.signing_key:
        key, link.key_origin = load_signing_key(sec.signing_key), f"file {sec.signing_key}"
    elif link.run_id in signing_keys:
        key, link.key_origin = signing_keys[link.run_id]
    else:
        raise SecureChannelError(
            "secure.mode = 'tee' needs the aggregator's attestation signing key: set "
            "secure.signing_key to a PEM file "
            "(`trustformer attest --keygen PREFIX` writes one)"
        )
    link.backend = SoftwareTEE(key, measurement(link.cfg), link.run_id, quote_validity_s=sec.quote_validity_s)
    log.info(
        "secure exchange: emulated TEE, measurement %s, attestation key %s… (%s)",
        link.backend.measurement(),
        public_key_hex(key)[:16],
        link.key_origin,
    )
    attested, failures = attest(link, 0, list(nodes))  # round 0: before the first round
    if len(attested) < needed:
        raise SecureChannelError(
            f"attestation failed for {len(nodes) - len(attested)} of {len(nodes)} client(s), {needed} "
            f"needed (federation.min_clients); no payload was sent. {failures[0] if failures else ''}"
        )


def attest(link: Any, rnd: int, nodes: list[int]) -> tuple[list[int], list[str]]:
    """The two ``query.attest`` steps with ``nodes``: returns the nodes that verified the quote, and
    why the others did not."""
    hello, failed = link.query(
        rnd, nodes, "hello", lambda _n: RecordDict({"config": ConfigRecord({"step": "hello"})}), "attest"
    )
    quotes: dict[int, tuple[bytes, bytes]] = {}
    failures = [f"client node {node}: {why}" for node, why in failed.items()]
    for node, reply in hello.items():
        try:
            record = reply.content["attest"]
            client, nonce, client_key = int(record["client"]), bytes(record["nonce"]), bytes(record["client_key"])
            started = time.perf_counter()
            quotes[node] = link.backend.quote(client, nonce, client_key)
            link.costs_of(rnd, node)["attest_s"] += time.perf_counter() - started
            link.node_client[node] = client
        except (KeyError, TypeError, ValueError, AttestationError) as exc:
            failures.append(f"client node {node}: {exc}")
            link.drop(rnd, node, f"attestation: {exc}")
    verified, failed = link.query(
        rnd,
        list(quotes),
        "quote",
        lambda n: RecordDict(
            {
                "config": ConfigRecord({"step": "quote"}),
                "attest": ConfigRecord({"quote": quotes[n][0], "signature": quotes[n][1]}),
            }
        ),
        "attest",
    )
    for node, why in failed.items():
        failures.append(f"client {link.node_client.pop(node)}: {why}")
    link.attested.update(verified)
    link.counts["attestations"] += len(verified)
    return list(verified), failures


__all__ = ["attest", "start_tee"]
