"""What the secure channel cost over the run: ``summary.json["secure"]`` (mode, backend, counts, overhead in bytes
and seconds, quantisation error) from the secure link's totals and the run's metrics lines."""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import records
from .attestation import measured_sources
from .sealing import REJECTED_TAG


def secure_summary(link: Any) -> dict[str, Any] | None:
    """``summary.json["secure"]``: mode, backend, counts, overhead (bytes, seconds), quantisation error."""
    records_ = link.recorder.records
    byte_keys = ("attest_bytes", "secagg_bytes", "payload_overhead_bytes")
    second_keys = ("attest_s", "seal_s", "open_s", "secagg_s")
    rejected = Counter(link.rejected)
    for event in link.recorder.events:  # a rejection by a client comes back as its error reply to train.apply
        reason = str(event.get("reason", ""))
        if event.get("event") == "dropped" and not reason.startswith(("query.", "attestation", "invalid payload")):
            count_client_rejection_into(rejected, reason)
    per_round: dict[str, dict[str, float]] = {}
    for rnd in sorted({r["round"] for r in records_}):
        rows = [r for r in records_ if r["round"] == rnd]
        per_round[str(rnd)] = {
            "bytes": sum(int(r.get(k, 0)) for r in rows for k in byte_keys),
            "seconds": round(
                sum(float(r.get(k, 0.0)) for r in rows for k in second_keys) + link.server_round_s.get(rnd, 0.0), 6
            ),
        }
    out: dict[str, Any] = {
        "mode": link.mode,
        "counts": {
            "attestations": link.counts["attestations"],
            "sealed": link.counts["sealed"],
            "opened": link.counts["opened"],
            "rejected": dict(sorted(rejected.items())),
        },
        "overhead": {
            "bytes": sum(v["bytes"] for v in per_round.values()),
            "seconds": round(sum(v["seconds"] for v in per_round.values()), 6),
            "per_round": per_round,
            "what": "bytes: attestation and secure-aggregation messages plus the secure payload records beyond "
            "their plain ArrayRecords; seconds: attestation, sealing, opening and secure-aggregation "
            "steps of clients and aggregator",
        },
    }
    if link.tee:
        out.update(
            {
                "backend": link.backend.name if link.backend else None,
                "emulated": bool(link.backend.emulated) if link.backend else True,
                "note": "software emulation of a TEE: quotes, keys and sealing are real, the hardware isolation "
                "is not (the server process holds the session keys and sees the opened payloads)",
                "measurement": link.backend.measurement() if link.backend else None,
                "measured_files": measured_sources(),
                "attestation_key": link.key_origin,
            }
        )
    if link.secagg:
        out["secagg"] = {
            "threshold": records.secagg_threshold(link.cfg),
            "scale_bits": link.cfg.secure.secagg_scale_bits,
            "rounds": link.secagg_rounds,
            "dropped_after_setup": link.dropped_after_setup,
            # max over rounds of the bound on each coordinate of the averaged payload (sum bound / divisor)
            "quantization_error_bound": max(link.bounds) if link.bounds else None,
            # simulation only: max |secagg mean - plain mean| (float64, before the cast to the payload dtype),
            # which is at most the bound plus the float64 rounding of the comparison
            "measured_max_error": max(link.measured_errors) if link.measured_errors else None,
            "float64_rounding": max(link.float64_rounding) if link.float64_rounding else None,
        }
    return out


def count_client_rejection_into(counter: Counter[str], why: str) -> None:
    if REJECTED_TAG + " (" in why and " failed: " in why:
        counter[why.split(REJECTED_TAG + " (", 1)[1].split(")", 1)[0] + " (by a client)"] += 1


__all__ = ["count_client_rejection_into", "secure_summary"]
