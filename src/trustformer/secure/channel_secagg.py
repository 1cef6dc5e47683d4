"""Secure aggregation on the secure channel (``secagg``, ``tee+secagg``; module docstring of ``channel.py``): per
exchange round the *keys* and *shares* steps before ``train``, then the *unmask* step and the survivors' mean, the
protocol's only input. The aggregator's side is :class:`~trustformer.secure.secagg.SecAggServer`; these functions
run its steps over the secure link."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict

from ..wire import PayloadError, TensorSpec
from . import codec, records
from .channel_errors import SecureChannelError
from .masking import SecAggError, quantization_error_bound
from .provision import plain_vectors
from .records import SECURE
from .secagg_server import SecAggServer


@dataclass
class SecAggRound:
    rnd: int
    server: SecAggServer
    spec: TensorSpec
    routed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # recipient -> sender -> ciphertext
    masked: dict[int, np.ndarray] = field(default_factory=dict)


def prepare_secagg(link: Any, rnd: int, participants: list[int], exchange: bool) -> list[int]:
    """The *keys* and *shares* steps of exchange round ``rnd`` with ``participants``; then the plain link's
    ``prepare`` with those whose shares were routed."""
    params = records.secagg_params(link.cfg)
    config = ConfigRecord({"round": rnd, "step": "keys"})
    replies, _failed = link.query(rnd, participants, "keys", lambda _n: RecordDict({"config": config}), "secagg")
    keys: dict[int, dict[str, bytes]] = {}
    specs: dict[int, TensorSpec] = {}
    for node, reply in replies.items():
        try:
            if not link.tee:  # with tee the client id is the attested one
                link.node_client[node] = int(reply.content["metrics"]["client"])
            arrays = records.unpack(
                reply.content, link.open_from(node, rnd, "secagg.keys"), None, f"secagg keys of node {node}"
            )
            if set(arrays) != {"c_pk", "s_pk", "spec"} or any(
                a.dtype != np.uint8 or a.ndim != 1 for a in arrays.values()
            ):
                raise codec.CodecError(f"secagg keys of node {node}: expected uint8 arrays c_pk, s_pk and spec")
            keys[node] = {"c_pk": arrays["c_pk"].tobytes(), "s_pk": arrays["s_pk"].tobytes()}
            specs[node] = records.parse_spec(arrays["spec"].tobytes(), f"secagg keys of node {node}")
        except (KeyError, PayloadError) as exc:
            link.drop(rnd, node, f"secagg keys: {exc}")
    if specs:  # the payload every client must announce follows from the configuration, not from a vote
        expected = records.spec_json(link.configured_spec())
        for node in [n for n in specs if records.spec_json(specs[n]) != expected]:
            link.drop(
                rnd,
                node,
                "secagg keys: the announced payload names/shapes differ from those the "
                "run's configuration and protocol give",
            )
            keys.pop(node)
            specs.pop(node)
    if len(keys) < params.threshold:
        raise SecureChannelError(
            f"round {rnd} (secagg keys): {len(keys)} client(s) advertised keys, the "
            f"threshold is {params.threshold} (secure.secagg_threshold)"
        )
    spec = next(iter(specs.values()))
    started = time.perf_counter()
    server = SecAggServer(
        list(range(link.cfg.federation.clients)),
        params,
        records.spec_length(spec),
        records.secagg_session(link.run_id, rnd),
    )
    try:
        broadcast = server.collect_keys({link.client_of(n): k for n, k in keys.items()})
    except SecAggError as exc:
        raise SecureChannelError(f"round {rnd} (secagg keys): {exc}") from None
    arrays = {f"{c}/{name}": records.bytes_array(v) for c, entry in broadcast.items() for name, v in entry.items()}
    link.server_round_s[rnd] += time.perf_counter() - started

    def addressed_to_the_others(client: int, entry: dict[int, bytes]) -> None:
        if set(entry) != set(broadcast) - {client} or not all(entry.values()):
            raise codec.CodecError(
                f"secagg shares of client {client}: addressed to {sorted(entry)}, "
                f"expected {sorted(set(broadcast) - {client})}"
            )

    shares = secagg_step(link, rnd, list(keys), "shares", arrays, "secagg shares", addressed_to_the_others)
    started = time.perf_counter()
    try:
        routed = server.route_shares(shares)
    except SecAggError as exc:
        raise SecureChannelError(f"round {rnd} (secagg shares): {exc}") from None
    link.secagg_round = SecAggRound(rnd=rnd, server=server, spec=spec, routed=routed)
    link.server_round_s[rnd] += time.perf_counter() - started
    link.secagg_rounds += 1
    return link.link.prepare(rnd, [n for n in participants if link.node_client.get(n) in routed], exchange)


def secagg_step(
    link: Any,
    rnd: int,
    nodes: list[int],
    step: str,
    arrays: dict[str, np.ndarray],
    what: str,
    check: Callable[[int, dict[int, bytes]], None] | None = None,
) -> dict[int, dict[int, bytes]]:
    """Send one secure-aggregation step (sealed in tee+secagg) to ``nodes``; each valid reply as
    client -> {client id: bytes}. A reply that cannot be opened, decoded or fails ``check`` drops
    that client from the round."""
    replies, _failed = link.query(
        rnd,
        nodes,
        step,
        lambda n: RecordDict(
            {
                "config": ConfigRecord({"round": rnd, "step": step}),
                SECURE: records.pack(arrays, link.seal_for(n, rnd, f"secagg.{step}")),
            }
        ),
        "secagg",
    )
    out: dict[int, dict[int, bytes]] = {}
    for node, reply in replies.items():
        client = link.client_of(node)
        label = f"{what} of client {client}"
        try:
            entry = records.id_keyed(
                records.unpack(reply.content, link.open_from(node, rnd, f"secagg.{step}"), None, label), label
            )
            if check is not None:
                check(client, entry)
            out[client] = entry
        except (KeyError, PayloadError) as exc:
            link.drop(rnd, node, f"{what}: {exc}")
    return out


def secagg_mean(
    link: Any, rnd: int, payloads: dict[int, dict[str, torch.Tensor]], examples: dict[int, int], weighting: str | None
) -> tuple[list[dict[str, torch.Tensor]], list[int], dict[str, float]]:
    """The survivors' mean of round ``rnd``, unmasked from the masked sum (weighted as the protocol declares)."""
    if weighting is None:
        raise SecureChannelError("secure aggregation needs a protocol whose aggregate is a mean of the payloads")
    nodes = list(payloads)
    started = time.perf_counter()
    state = link.secagg_round
    if state is None:
        raise SecureChannelError(f"round {rnd}: no secure-aggregation round to unmask")
    try:
        survivors, dropped = state.server.collect_masked(
            {link.client_of(n): state.masked[link.client_of(n)] for n in nodes}
        )
    except SecAggError as exc:
        raise SecureChannelError(f"round {rnd} (secagg masked inputs): {exc}") from None
    link.secagg_round = None
    link.dropped_after_setup += len(dropped)
    by_client = {link.client_of(n): n for n in nodes}
    request = {"survivors": np.array(survivors, dtype=np.int64), "dropped": np.array(dropped, dtype=np.int64)}
    link.server_round_s[rnd] += time.perf_counter() - started
    revealed = secagg_step(link, rnd, nodes, "unmask", request, "secagg unmask")
    started = time.perf_counter()
    try:
        total = state.server.unmask(revealed)
    except SecAggError as exc:
        raise SecureChannelError(f"round {rnd} (secagg unmask): {exc}") from None
    divisor = (
        float(sum(examples[by_client[c]] for c in survivors)) if weighting == "examples" else float(len(survivors))
    )
    mean = total / divisor
    link.bounds.append(quantization_error_bound(len(survivors), link.cfg.secure.secagg_scale_bits) / divisor)
    plain = plain_vectors.pop((link.run_id, rnd), None)
    if plain is not None and all(c in plain for c in survivors):  # simulation only (diagnostics)
        exact = np.sum([plain[c] for c in survivors], axis=0) / divisor
        link.measured_errors.append(float(np.max(np.abs(mean - exact))))
        # the float64 rounding of the two means compared, on top of the quantisation bound
        magnitude = np.sum([np.abs(plain[c]) for c in survivors], axis=0) / divisor
        link.float64_rounding.append(4 * float(np.finfo(np.float64).eps) * float(np.max(magnitude)))
    aggregate, offset = {}, 0
    for name, (shape, dtype) in sorted(state.spec.items()):
        size = int(np.prod(shape))
        aggregate[name] = torch.from_numpy(mean[offset : offset + size].reshape(shape)).to(getattr(torch, dtype))
        offset += size
    link.server_round_s[rnd] += time.perf_counter() - started
    return [aggregate], [1], {"secagg_server_s": link.server_round_s[rnd]}


__all__ = ["SecAggRound", "prepare_secagg", "secagg_mean", "secagg_step"]
