"""The measured cost of secure aggregation (module docstring of ``secagg.py``): seconds per protocol step, bytes per
message kind and the error against the plain sum, with and without a client dropped after the shares."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from trustformer.secure.masking import SecAggError, quantization_error_bound
from trustformer.secure.secagg_client import SecAggClient
from trustformer.secure.secagg_common import SecAggParams
from trustformer.secure.secagg_server import SecAggServer


def run_protocol(
    vectors: Mapping[int, np.ndarray], params: SecAggParams, session: bytes, drop_after_shares: Sequence[int] = ()
) -> tuple[np.ndarray, dict[str, float], dict[str, int]]:
    """One full protocol instance; returns the sum, seconds per step and bytes per message kind."""
    ids = sorted(vectors)
    length = len(next(iter(vectors.values())))
    seconds: dict[str, float] = {}

    def timed(name: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return result

    server = SecAggServer(ids, params, length, session)
    clients = {i: SecAggClient(i, ids, params, session, length=length) for i in ids}
    advertised = {i: timed("advertise_keys", c.advertise_keys) for i, c in clients.items()}
    broadcast = timed("collect_keys", server.collect_keys, advertised)
    sent = {i: timed("share_keys", c.share_keys, broadcast) for i, c in clients.items()}
    routed = timed("route_shares", server.route_shares, sent)
    live = [i for i in ids if i not in set(drop_after_shares)]
    masked = {i: timed("masked_input", clients[i].masked_input, vectors[i], routed[i]) for i in live}
    survivors, dropped = timed("collect_masked", server.collect_masked, masked)
    revealed = {i: timed("client_unmask", clients[i].unmask, survivors, dropped) for i in survivors}
    total = timed("server_unmask", server.unmask, revealed)
    sizes = {
        "keys_bytes": sum(len(v) for e in advertised.values() for v in e.values()),
        "share_ciphertext_bytes": sum(len(ct) for e in sent.values() for ct in e.values()),
        "masked_bytes": sum(y.nbytes for y in masked.values()),
        "unmask_share_bytes": sum(len(s) for e in revealed.values() for s in e.values()),
    }
    return total, seconds, sizes


def benchmark(length: int, num_clients: int) -> dict:
    """Measure seconds per protocol step for ``num_clients`` clients masking ``length``-element vectors.

    Client steps are reported as the mean per client; server steps as totals. A second instance
    with one client dropped after ``share_keys`` measures the dropout recovery (when the threshold
    allows it). Also reports the plain float sum time as a baseline, the bytes per message kind, and
    the measured max error against the plain sum next to ``quantization_error_bound``.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise SecAggError(f"secagg benchmark: length must be a positive integer, got {length!r}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 2:
        raise SecAggError(f"secagg benchmark: num_clients must be an integer >= 2, got {num_clients!r}")
    params = SecAggParams(threshold=max(2, num_clients // 2 + 1))
    rng = np.random.default_rng(0)
    vectors = {i: rng.normal(0.0, 1.0, length).astype(np.float32) for i in range(num_clients)}
    start = time.perf_counter()
    plain = np.zeros(length, dtype=np.float64)
    for v in vectors.values():
        plain += v
    plain_s = time.perf_counter() - start
    total, seconds, sizes = run_protocol(vectors, params, b"benchmark/all-survive")
    per_client = {"advertise_keys", "share_keys", "masked_input", "client_unmask"}
    result: dict = {
        "length": length,
        "num_clients": num_clients,
        "threshold": params.threshold,
        "scale_bits": params.scale_bits,
        "plain_sum_s": plain_s,
    }
    for name, value in seconds.items():
        result[f"{name}_s"] = value / num_clients if name in per_client else value
    result["total_s"] = sum(seconds.values())
    result.update(sizes)
    result["plain_float32_bytes"] = 4 * length * num_clients
    result["max_abs_error"] = float(np.max(np.abs(total - plain)))
    result["error_bound"] = quantization_error_bound(num_clients, params.scale_bits)
    if num_clients - 1 >= params.threshold:
        survivors = {i: v for i, v in vectors.items() if i != num_clients - 1}
        dropped_total, dropped_seconds, _ = run_protocol(
            vectors, params, b"benchmark/one-dropped", drop_after_shares=[num_clients - 1]
        )
        result["server_unmask_one_dropped_s"] = dropped_seconds["server_unmask"]
        plain_survivors = np.sum([v.astype(np.float64) for v in survivors.values()], axis=0)
        result["max_abs_error_one_dropped"] = float(np.max(np.abs(dropped_total - plain_survivors)))
    return result


__all__ = ["benchmark", "run_protocol"]
