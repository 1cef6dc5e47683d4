"""`trustformer bench dp-noise`: the noise on the aggregate of record-level DP, per-owner against distributed
(``privacy.noise``; docs/privacy.md "Distributed noise"), measured through real secure aggregation.

For each ε of ``--epsilons``, σ is the one distributed noise plans for the run (``tasks/record_dp.py:plan``), so
every row is at that same ε: an owner that takes the same DP-SGD steps at the same sampling rate adding N(0, σ²C²)
itself (``per-owner``), or its share N(0, σ²C²/k) (``distributed``). Every owner takes one DP-SGD step from the
run's initial model on its own shard, twice from the same seeded Poisson draw: with its noise and without. Its
payload is the model after a plain SGD step at learning rate 1 (the distributed step's payload), so the noise it
carries is the noise on its clipped sum ÷ B. The owners' noisy payloads go through the real secure aggregation
(X25519 key agreement, Shamir shares, masking in Z_2^64, unmasking; ``bench/secagg_bench.py``); the noise-free
ones are averaged in the clear. The standard deviation of the difference over every coordinate is the measured
noise on the aggregate, beside the predicted σC/(B√m) (per-owner) and σC/(Bm) (distributed).

Rows besides: one owner dropping after the shares with ``privacy.dropout_tolerance = 1`` (shares sized for m − 1:
the sum keeps σC), one owner adding no share (a planted bug: the noise falls short by √((m − 1)/m)), and the
seconds and bytes of one secure-aggregation round. The noise is seeded (``privacy.noise_source =
"seeded-not-private"``): the bench measures, it trains nothing private.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trustformer.config import RunConfig, load_config
from trustformer.core.dpsgd import RecordDP
from trustformer.secure.records import secagg_params
from trustformer.tasks import record_dp
from trustformer.tasks.run import load_task

from .secagg_bench import run_protocol

SETTING: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.noise": "distributed",
    "privacy.noise_source": "seeded-not-private",
    "secure.mode": "secagg",
    "runtime.checkpoint": False,
}


def _payload(cfg: RunConfig, task, client: int, dp: RecordDP) -> np.ndarray:
    """Client ``client``'s payload after one DP-SGD step of ``dp`` (SGD, learning rate 1) from the initial model."""
    model = task.initial_model()
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    record_dp.run_steps(cfg, model, sgd, task.shard(client), dp, 1, 1000 + client, None, {}, None)
    return torch.cat([p.detach().double().flatten() for p in model.parameters() if p.requires_grad]).numpy()


def measure(cfg: RunConfig) -> list[dict[str, Any]]:
    """Rows (mode, predicted and measured noise std on the aggregate, their ratio) for ``cfg``'s ε."""
    task: Any = load_task(cfg)  # the translation task (record-level DP's only one)
    m = cfg.federation.clients
    sizes = task.shard_sizes()
    plans = {c: record_dp.plan(cfg, sizes[c], sizes) for c in range(m)}
    sigma, C, B = plans[0].noise_multiplier, cfg.privacy.clip_norm, plans[0].expected_batch
    quiet = {c: _payload(cfg, task, c, dataclasses.replace(plans[c], noise_multiplier=0.0)) for c in range(m)}
    rows: list[dict[str, Any]] = []
    cases = [
        ("per-owner", [sigma] * m, (), 0, C * sigma / (B * math.sqrt(m))),
        ("distributed", [sigma / math.sqrt(m)] * m, (), 0, C * sigma / (B * m)),
        ("distributed, d=1, one dropped", [sigma / math.sqrt(m - 1)] * m, (m - 1,), 1, C * sigma / (B * (m - 1))),
        ("distributed, one share left out (bug)", [0.0] + [sigma / math.sqrt(m)] * (m - 1), (), 0, C * sigma / (B * m)),
    ]
    for label, multipliers, dropped, tolerance, predicted in cases:
        noisy = {
            c: _payload(cfg, task, c, dataclasses.replace(plans[c], noise_multiplier=multipliers[c])) for c in range(m)
        }
        params = secagg_params(
            dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, dropout_tolerance=tolerance))
        )
        started = time.perf_counter()
        total, seconds, sizes_bytes = run_protocol(
            {c: v.astype(np.float64) for c, v in noisy.items()}, params, f"dp-noise/{label}".encode(), dropped
        )
        wall = time.perf_counter() - started
        survivors = [c for c in range(m) if c not in dropped]
        released = total / len(survivors)
        clean = np.mean([quiet[c] for c in survivors], axis=0)
        measured = float(np.std(released - clean))
        rows.append(
            {
                "epsilon": cfg.privacy.epsilon,
                "mode": label,
                "sigma": sigma,
                "owner_multipliers": multipliers,
                "survivors": len(survivors),
                "predicted_std": predicted,
                "measured_std": measured,
                "measured_over_predicted": measured / predicted,
                "coordinates": int(released.size),
                "secagg_s": wall,
                "secagg_bytes": int(sum(sizes_bytes.values())),
            }
        )
    base = float(rows[0]["measured_std"])
    for row in rows:
        row["over_per_owner"] = row["measured_std"] / base
    rows[1]["target_ratio"] = 1.0 / math.sqrt(m)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ε | noise | σ | predicted std | measured std | measured/predicted | × per-owner | secagg s | secagg bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['epsilon']:g} | {r['mode']} | {r['sigma']:.3f} | {r['predicted_std']:.3e} | "
            f"{r['measured_std']:.3e} | {r['measured_over_predicted']:.3f} | {r['over_per_owner']:.3f} | "
            f"{r['secagg_s']:.2f} | {r['secagg_bytes']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trustformer bench dp-noise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="the run's preset (default tiny)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other option")
    parser.add_argument("--epsilons", default="1,8", help="comma-separated ε (default 1,8)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = dict(SETTING)
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    rows = []
    for eps in [float(e) for e in args.epsilons.split(",") if e.strip()]:
        cfg = load_config(args.preset, None, {**overrides, "privacy.epsilon": eps})
        rows += measure(cfg)
        print(table([r for r in rows if r["epsilon"] == eps]), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
