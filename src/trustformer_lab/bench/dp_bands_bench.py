"""`trustformer bench dp-bands`: the noise banded correlation leaves in the model, against fresh noise at the same ε
(``privacy.noise_bands``, core/banded_noise.py), before any run spends compute on it.

For each ε, number of rounds T and band count b, the run's own planner (``tasks/record_dp.py:plan``, distributed
noise over ``--owners`` owners of ``--records`` records each, expected batch ``--batch`` per owner) gives σ of the
fresh noise z, the rate q of b-min-sep sampling and the expected batch B_b (at most the group's records, N/b).
After t rounds of SGD at a constant rate the model carries (A·C⁻¹z)_t / (m·B_b); the table gives it per coordinate
in units of the learning rate times C, as the RMS over the T rounds and at the last round:

- **predicted** from the matrices: σ·‖(A·C⁻¹)_t‖ / (m·B_b);
- **measured** by ``--owners`` owners each correlating its share N(0, σ²C²/m) with :class:`BandedNoise` (the code
  the runs use) over ``--coordinates`` coordinates, their shares summed, the prefix sums taken;
- and each against b = 1 (fresh noise, DP-SGD's accounting) at the same ε and T: below 1, the banded run's model
  is less noisy. A smaller batch per step (N/b < B) counts against it: the same noise on less signal.

The noise here is seeded: the bench measures, it trains nothing private.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from trustformer.config import load_config
from trustformer.core import banded_noise as bn
from trustformer.tasks import record_dp


def planned(epsilon: float, rounds: int, bands: int, records: int, batch: int, owners: int, delta: float):
    """The run's mechanism (σ, q, B_b, ‖C‖_col) as ``tasks/record_dp.py`` plans it for these settings."""
    cfg = load_config(
        "tiny",
        None,
        {
            "out": "",
            "privacy.unit": "record",
            "privacy.noise": "distributed",
            "secure.mode": "secagg",
            "privacy.epsilon": epsilon,
            "privacy.delta": delta,
            "privacy.batch_size": batch,
            "privacy.noise_bands": bands,
            "federation.rounds": rounds,
            "federation.clients": owners,
        },
    )
    return record_dp.plan(cfg, records, (records,) * owners)


def measured_rms(
    sigma: float, bands: int, rounds: int, owners: int, coordinates: int, seed: int
) -> tuple[float, float]:
    """(RMS over the rounds, at the last round) of the prefix sums of the owners' summed correlated shares."""
    g = torch.Generator().manual_seed(seed)
    states = [bn.BandedNoise(bn.sqrt_coefficients(bands)) for _ in range(owners)]
    total = torch.zeros(coordinates, dtype=torch.float64)
    squares = []
    for _t in range(rounds):
        step = sum(
            s.correlate("w", torch.randn(coordinates, generator=g, dtype=torch.float64) * sigma / math.sqrt(owners))
            for s in states
        )
        total += step
        squares.append(float(total.pow(2).mean()))
    return math.sqrt(sum(squares) / rounds), math.sqrt(squares[-1])


def row(epsilon: float, rounds: int, bands: int, args: argparse.Namespace) -> dict[str, Any]:
    dp = planned(epsilon, rounds, bands, args.records, args.batch, args.owners, args.delta)
    rows = bn.prefix_noise(bn.sqrt_coefficients(bands), rounds).pow(2).sum(1)
    pooled = args.owners * dp.expected_batch
    rms, last = measured_rms(dp.noise_multiplier, bands, rounds, args.owners, args.coordinates, args.seed)
    return {
        "epsilon": epsilon,
        "rounds": rounds,
        "bands": bands,
        "sample_rate": dp.sample_rate,
        "expected_batch": dp.expected_batch,
        "sigma": dp.noise_multiplier,
        "column_norm": dp.column_norm,
        "sigma_accounted": dp.noise_multiplier / dp.column_norm,
        "epsilon_planned": dp.epsilon(rounds),
        "predicted_rms": dp.noise_multiplier * math.sqrt(float(rows.mean())) / pooled,
        "predicted_last": dp.noise_multiplier * math.sqrt(float(rows[-1])) / pooled,
        "measured_rms": rms / pooled,
        "measured_last": last / pooled,
    }


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for eps in args.epsilons:
        for rounds in args.rounds:
            fresh = None
            for bands in [1, *[b for b in args.bands if b > 1 and b <= rounds]]:
                r = row(eps, rounds, bands, args)
                fresh = fresh or r
                r["rms_vs_fresh"] = r["predicted_rms"] / fresh["predicted_rms"]
                r["last_vs_fresh"] = r["predicted_last"] / fresh["predicted_last"]
                out.append(r)
                print(line(r), flush=True)
    return out


HEADER = (
    "| ε | rounds | bands | q | B per owner | σ (fresh z) | ‖C‖col | ε planned | RMS predicted | RMS measured | "
    "last predicted | last measured | RMS ÷ fresh | last ÷ fresh |\n|" + "---|" * 14
)


def line(r: dict[str, Any]) -> str:
    return (
        f"| {r['epsilon']:g} | {r['rounds']} | {r['bands']} | {r['sample_rate']:.3f} | {r['expected_batch']} | "
        f"{r['sigma']:.3f} | {r['column_norm']:.3f} | {r['epsilon_planned']:.3f} | {r['predicted_rms']:.3g} | "
        f"{r['measured_rms']:.3g} | {r['predicted_last']:.3g} | {r['measured_last']:.3g} | "
        f"{r['rms_vs_fresh']:.2f} | {r['last_vs_fresh']:.2f} |"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trustformer bench dp-bands", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilons", default="1,8", help="comma-separated ε (default 1,8)")
    parser.add_argument("--rounds", default="10,50,200", help="comma-separated T (default 10,50,200)")
    parser.add_argument("--bands", default="2,4,8,16,32", help="comma-separated b > 1 (b = 1 is always the reference)")
    parser.add_argument("--records", type=int, default=3000, help="records per owner (default 3000)")
    parser.add_argument("--batch", type=int, default=1024, help="expected batch per owner (privacy.batch_size)")
    parser.add_argument("--owners", type=int, default=3, help="owners adding shares (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--coordinates", type=int, default=4096, help="coordinates of the measured noise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    args.epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
    args.rounds, args.bands = _ints(args.rounds), _ints(args.bands)
    if any(b < 1 for b in args.bands) or any(t < 1 for t in args.rounds):
        parser.error("--bands and --rounds take positive integers")
    print(HEADER, flush=True)
    rows = measure(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        payload = {"command": "trustformer bench dp-bands " + " ".join(argv), "rows": rows}
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
