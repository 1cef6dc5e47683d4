"""What the one-run audit resolves: the noise taken out of one parameter group (or one kind of tensor) at a time,
after Opacus adds it, the accountant still reporting ε. Prints one row per plant: its canaries, ε_lb and whether
the audit fails the run (ε_lb > ε). docs/privacy.md "Auditing the guarantee".

    python scripts/audit_plants.py --preset tiny --json docs/bench/audit-plants.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import opacus.optimizers

from trustformer.config import load_config
from trustformer.core import dpsgd
from trustformer.tasks import dp_canaries
from trustformer.tasks.run import load_task
from trustformer_lab.attack.dp_audit import audit

VALUES: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.epsilon": 1.0,
    "privacy.delta": 1e-5,
    "privacy.batch_size": 60,
    "privacy.audit_canaries": 5000,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
}
_TARGET: dict[str, Any] = {"label": None}
_original_trainable = dpsgd._trainable
_Original = opacus.optimizers.DPOptimizer


def _tagged(model):
    params = _original_trainable(model)
    kinds = dp_canaries.parameter_kinds(model)
    for name, p in params.items():
        p._planted = _TARGET["label"] in (dp_canaries.parameter_group(name), kinds[name])
    return params


class _NoiseMissing(_Original):
    """Opacus' optimizer with the noise taken back out of the planted tensors."""

    def add_noise(self):
        super().add_noise()
        for p in self.params:
            if getattr(p, "_planted", False):
                p.grad = p.summed_grad.view_as(p).to(p.grad.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--out", default="runs/audit-plants")
    parser.add_argument("--json")
    args = parser.parse_args()
    dpsgd._trainable = _tagged
    opacus.optimizers.DPOptimizer = _NoiseMissing
    cfg = load_config(args.preset, None, {**VALUES, "out": str(Path(args.out) / "none")})
    canaries = load_task(cfg).audit_canaries()
    labels = [("group", g) for g in dict.fromkeys(canaries.groups)] + [
        ("kind", k) for k in dict.fromkeys(canaries.kinds)
    ]
    rows = []
    print("| plant: noise missing from | canaries there | ε | ε_lb | audit |\n|---|---|---|---|---|")
    for what, label in [("none", None), *labels]:
        _TARGET["label"] = label
        folder = Path(args.out) / f"{what}-{len(rows)}"
        result = audit(load_config(args.preset, None, {**VALUES, "out": str(folder)}))
        held = sum(1 for g, k in zip(canaries.groups, canaries.kinds) if label in (g, k))
        row = {"what": what, "label": label, "canaries": held, **{k: result[k] for k in ("epsilon", "epsilon_lb")}}
        row["fails"] = result["epsilon_lb"] > result["epsilon"]
        rows.append(row)
        print(
            f"| {label or '(nothing: honest run)'} ({what}) | {held} | {row['epsilon']:.3f} | {row['epsilon_lb']:.3f} "
            f"| {'FAILS' if row['fails'] else 'passes'} |",
            flush=True,
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
