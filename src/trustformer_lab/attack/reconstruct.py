"""`trustformer attack reconstruct`: what an honest-but-curious server learns, measured.

The command runs a federation in this process (the real round loop ``trustformer.app.run_federation``
on the in-process runtime, real Flower messages, the configured ``secure.mode``) and plays the server
that follows the protocol but tries to learn each client's model. From what the server holds — the
payloads it receives, the aggregates it sends, the run configuration and the public initial model (and
the memberships, wherever it can derive them) — it builds its best estimate of every client's
**locally trained model**: the client's trainable tensors right after local training, at the moment
the client builds its payload. The true model is captured by an observer of the protocol objects
(``protocols.observe``), kept by this harness only, never sent.

Per exchange round and client it reports, over all trainable weights:

- ``relative_error`` = ‖estimate − true‖ / ‖true‖ (L2);
- ``recovered_fraction`` = the fraction of weights whose estimate is within 1e-6 (absolute) of the truth.

The headline figures (``relative_error_mean``, ``recovered_fraction_mean``) are the means over the
clients at the **last exchange round**; every exchange round is in ``rounds`` of the JSON.
``initial_error_mean`` is the error of estimating every client by the public initial model (what
the server knows without receiving anything): an estimator that ignored the payload would score that.

What the server holds, per ``secure.mode``:

- ``none``: every client's decoded payload.
- ``tee``: the aggregator's code receives every opened payload; the TEE here is a software emulation
  that opens payloads in the server process (``secure/tee.py``), so the operator of that process sees
  them too and the attack uses them (the same figures as ``none``). A real enclave would leave the
  operator with the aggregate only, i.e. the ``secagg`` rows.
- ``secagg`` / ``tee+secagg``: only the sum of the masked payloads, i.e. the aggregate. Every client is
  estimated from the aggregate, as if it had sent it.

The estimators (one per strategy, :data:`ESTIMATORS`); ``G`` is the global model the server sent last
(round 1: the public initial model), which it tracks itself from the aggregates:

- ``fedavg``: the payload is the model: estimate = payload (exact).
- ``fedavg-topk``: the payload is the sparse update (indices, values): estimate = G + update; the
  coordinates not sent are estimated by G.
- ``dp-fedavg``, ``dp-fedsam``: the payload is the clipped update Δ: estimate = G + Δ (the server
  does not know by how much Δ was scaled down).
- ``dp-blur-lus``: the clipped sparse update: estimate = G + update on the kept coordinates.
- ``trustformer``: the payload holds per layer the k×f centroids L of its r×f layer matrix
  (``core.centroids.layer_matrix``). Estimate, per row: ``R[row] + (L[c(row)] − mean of R over the
  rows of cluster c(row))``, where R is the server's reference: the public initial model before the
  first exchange, then the consensus model every client can compute (R shifted so that each cluster's
  mean is the global centroid sent). Memberships c: from the protocol's ``server_labels(initial,
  history, round)`` where it has one and it returns labels (the memberships the server derives from public
  information; ``history`` = the aggregates it sent before, as sent); else, when k = r, every row its
  own cluster in order (the k-means engine's solution for k = r in every mode); else **guessed**: each
  reference row is assigned to its nearest received centroid (squared L2, ties to the lowest index).
  The JSON's ``memberships_source`` says which was used. A guess is a lower bound on what the server
  can learn. A payload packed by the protocol is unpacked with its ``unpack_payload`` where it has one.
- ``local``, ``centralized``: nothing is received: estimate = the public initial model (the truth is
  the model after the last round, read from the clients' state kept on disk for this run).

Measured (``small`` translation preset, 3 clients × 300 pairs, 2 rounds, seed 0, one thread per run,
Trustformer under the default privacy floor ``min_cluster_rows = 2``; 8.4 min for the 24 runs), mean
over clients at the last exchange (round 2)::

    trustformer attack reconstruct --rounds 2 --clients 3 --set data.client_size=300 \\
        --strategies fedavg,trustformer,fedavg-topk --betas 0.1,0.5 \\
        --memberships rotating,focused,tracked,shared,local --secure-modes none,secagg --set runtime.threads=1

==================================  ==============  ==========  =========  ========
run                                 server sees     rel. error  recovered  init err
==================================  ==============  ==========  =========  ========
fedavg                              every payload   0.0000      1.0000     0.1269
trustformer β=0.1 rotating          every payload   0.0815      0.0001     0.1283
trustformer β=0.1 focused           every payload   0.0821      0.0001     0.1283
trustformer β=0.1 tracked           every payload   0.0826      0.0001     0.1283
trustformer β=0.1 shared            every payload   0.0832      0.0001     0.1283
trustformer β=0.1 local             every payload   0.1428      0.0001     0.1676
trustformer β=0.5 rotating          every payload   0.0549      0.0002     0.1278
trustformer β=0.5 focused           every payload   0.0526      0.0003     0.1278
trustformer β=0.5 tracked           every payload   0.0586      0.0002     0.1278
trustformer β=0.5 shared            every payload   0.0616      0.0002     0.1277
trustformer β=0.5 local             every payload   0.4701      0.0001     0.4840
fedavg-topk keep=0.1                every payload   0.0804      0.0344     0.1162
fedavg-topk keep=0.5                every payload   0.0197      0.3097     0.1258
fedavg +secagg                      aggregate only  0.0357      0.0005     0.1269
trustformer β=0.1 rotating +secagg  aggregate only  0.0840      0.0001     0.1283
trustformer β=0.1 focused +secagg   aggregate only  0.0844      0.0001     0.1283
trustformer β=0.1 tracked +secagg   aggregate only  0.0848      0.0001     0.1283
trustformer β=0.1 shared +secagg    aggregate only  0.0854      0.0001     0.1283
trustformer β=0.1 local +secagg     aggregate only  0.1495      0.0001     0.1676
trustformer β=0.5 rotating +secagg  aggregate only  0.0629      0.0002     0.1278
trustformer β=0.5 focused +secagg   aggregate only  0.0606      0.0002     0.1278
trustformer β=0.5 tracked +secagg   aggregate only  0.0653      0.0002     0.1278
trustformer β=0.5 shared +secagg    aggregate only  0.0677      0.0002     0.1277
trustformer β=0.5 local +secagg     aggregate only  0.4902      0.0001     0.4840
==================================  ==============  ==========  =========  ========

Every Trustformer mode but ``local`` had its memberships derived by the server (``server_labels``);
``local``'s were guessed. Before the floor (``min_cluster_rows = 1``, the paper's protocol) the same
command recovered 28% of every client's weights at β = 0.5 and 1.2% at β = 0.1 (singleton clusters).
``fedavg-topk`` recovers 10.0% / 50.0% in round 1, fewer in round 2 because error feedback adds last
round's residual to what is sent. Under ``tee`` (emulated: the payloads are opened inside the server
process) the attack gives the ``none`` figures, under ``tee+secagg`` the ``secagg`` ones.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trustformer.config import ConfigError, RunConfig, load_config
from trustformer.protocols.trustformer import MODES as MEMBERSHIP_MODES
from trustformer.registry import protocol_spec

from .estimators import ESTIMATORS, centroid_estimate, nearest_centroid
from .harness import run_attack
from .run_observer import Exchange, RunRecorder
from .scoring import TOLERANCE, attack, score

log = logging.getLogger(__name__)

FAST_EVAL: dict[str, Any] = {"eval.meteor": False, "eval.bertscore": False}
"""The attack needs no final scores beyond what the run always computes: METEOR and BERTScore are off
unless ``--set`` turns them on."""


@dataclass
class PlannedRun:
    label: str
    overrides: dict[str, Any]


def plan(
    cfg: RunConfig,
    strategies: Sequence[str] | None,
    betas: Sequence[float] | None,
    memberships: Sequence[str] | None,
    secure_modes: Sequence[str] | None,
) -> tuple[list[PlannedRun], list[str]]:
    """The runs of a sweep (strategy × β × memberships for trustformer, × secure mode; fedavg-topk at
    ``topk_keep`` = each β when --betas is given) and the combinations skipped, with why."""
    from trustformer.config import SECURE_MODES, STRATEGIES

    fed = cfg.federation
    strategies = list(strategies or [fed.strategy])
    for s in strategies:
        if s not in STRATEGIES:
            raise ConfigError(f"--strategies: unknown strategy {s!r} (choose from {', '.join(STRATEGIES)})")
    modes = list(secure_modes or [cfg.secure.mode])
    for m in modes:
        if m not in SECURE_MODES:
            raise ConfigError(f"--secure-modes: unknown mode {m!r} (choose from {', '.join(SECURE_MODES)})")
    for m in memberships or []:
        if m not in MEMBERSHIP_MODES:
            raise ConfigError(f"--memberships: unknown mode {m!r} (choose from {', '.join(MEMBERSHIP_MODES)})")
    for b in betas or []:
        if not 0.0 < b <= 1.0:
            raise ConfigError(f"--betas: beta {b:g} must be in (0, 1]")
    runs: list[PlannedRun] = []
    skipped: list[str] = []
    for mode in modes:
        for strategy in strategies:
            base = {"federation.strategy": strategy, "secure.mode": mode}
            variants: list[tuple[str, dict[str, Any]]]
            sweep = protocol_spec(strategy).variants
            variants = (sweep(cfg, betas, memberships) if sweep is not None else None) or [(strategy, {})]
            for label, extra in variants:
                overrides = {**base, **extra}
                label = label if mode == "none" else f"{label} +{mode}"
                try:
                    load_config(cfg.preset, None, {**cfg.flat(), **overrides})
                except ConfigError as exc:
                    skipped.append(f"{label}: {exc}")
                    continue
                runs.append(PlannedRun(label, overrides))
    return runs, skipped


def run_folder(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in label.replace("β=", "beta"))


def sweep(cfg: RunConfig, runs: Sequence[PlannedRun], *, progress: bool = True) -> list[dict[str, Any]]:
    """Every planned run, attacked, one after the other (progress lines with ETA on stderr)."""
    results = []
    started = time.perf_counter()
    out = Path(cfg.out)
    for i, run in enumerate(runs, start=1):
        run_cfg = load_config(
            cfg.preset, None, {**cfg.flat(), **run.overrides, "out": str(out / run_folder(run.label))}
        )
        result = run_attack(run_cfg)
        result["run"] = run.label
        result["overrides"] = run.overrides
        results.append(result)
        if progress:
            elapsed = time.perf_counter() - started
            eta = elapsed / i * (len(runs) - i)
            print(
                f"[{i}/{len(runs)}] {run.label}: relative error {result['relative_error_mean']:.4g} · "
                f"recovered {result['recovered_fraction_mean']:.4f} · {result['wall_s']:.0f} s · "
                f"elapsed {elapsed / 60:.1f} min · ETA {eta / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    return results


TABLE_NOTE = (
    f"relative error ||estimate - true|| / ||true|| and fraction of weights within {TOLERANCE:g}, mean over "
    "clients at the last exchange round; init err: the public initial model as the estimate"
)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'run':<40} {'server sees':<14} {'rel. error':>10} {'recovered':>9} {'init err':>8} "
        f"{'memberships':<24} {'wall s':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        source = r.get("memberships_source") or "-"
        lines.append(
            f"{r['run']:<40} {r['server_sees']:<14} {r['relative_error_mean']:>10.4f} "
            f"{r['recovered_fraction_mean']:>9.4f} {r['initial_error_mean']:>8.4f} {source:<24} "
            f"{r['wall_s']:>6.0f}"
        )
    return "\n".join(lines)


def write_json(path: str | Path, cfg: RunConfig, results: Sequence[dict[str, Any]], command: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "command": command,
        "setting": cfg.to_dict(),
        "tolerance": TOLERANCE,
        "headline": "mean over clients at the last exchange round",
        "runs": list(results),
    }
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False, allow_nan=True) + "\n", encoding="utf-8")


__all__ = [
    "ESTIMATORS",
    "Exchange",
    "RunRecorder",
    "attack",
    "centroid_estimate",
    "format_table",
    "nearest_centroid",
    "plan",
    "run_attack",
    "score",
    "sweep",
    "write_json",
]
