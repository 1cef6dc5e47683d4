"""Timing runs of the image tasks: centralized training, or a plain FedAvg loop, with the test score
after every epoch (round) and the wall time — what the ``small`` presets were chosen from.

    python -m trustformer_lab.bench.image_tasks_bench --task image --preset small --epochs 6 --threads 1
    python -m trustformer_lab.bench.image_tasks_bench --task segmentation --preset small --epochs 30 --threads 1
    python -m trustformer_lab.bench.image_tasks_bench --task image --preset small --clients 3 --epochs 6   # FedAvg

``--clients 1`` (default) trains one model on the whole training set. ``--clients N`` runs FedAvg
(McMahan et al. 2017, Algorithm 1, every client in every round): each round, every client starts from
the global model, trains ``--local-epochs`` on its shard with its own optimizer (kept across rounds,
as the federated runtime does) and the server averages the models weighted by shard size. Clients
run one after another, as in the in-process runtime. Each line of output is one epoch (round): the
training loss, the test loss and score of the (global) model, the seconds spent training and
evaluating, and the elapsed total. ``--json FILE`` writes the same as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, cast

import torch


def _parse_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return tuple(value) if isinstance(value, list) else value


def make_task(task: str, preset: str, overrides: dict[str, Any], seed: int):
    if task in ("image", "image-classification"):
        from trustformer.config import image_preset
        from trustformer.tasks.image import ImageClassificationTask

        return ImageClassificationTask(image_preset(preset, **overrides), seed=seed)
    if task == "segmentation":
        from trustformer.config import seg_preset
        from trustformer.tasks.segmentation import SegmentationTask

        return SegmentationTask(seg_preset(preset, **overrides), seed=seed)
    raise SystemExit(f"--task must be image or segmentation; got {task!r}")


def score_line(task, metrics: dict[str, Any]) -> dict[str, float]:
    if task.name == "image-classification":
        return {"accuracy": metrics["accuracy"], "test_loss": metrics["test_loss"]}
    return {k: metrics[k] for k in ("dice", "iou", "pixel_accuracy", "dice_per_image", "test_loss")}


def fedavg_average(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[str, torch.Tensor]:
    """Σ_k (n_k / n) · w_k (McMahan et al. 2017, Algorithm 1)."""
    total = float(sum(weights))
    return {  # a sum over at least one state: a tensor (sum's start 0 is only its type's other option)
        name: cast(torch.Tensor, sum(s[name].double() * (w / total) for s, w in zip(states, weights, strict=True))).to(
            states[0][name].dtype
        )
        for name in states[0]
    }


def run(
    task, *, epochs: int, clients: int, partition: str, local_epochs: int, seed: int, log=print, figure: str = ""
) -> list[dict]:
    """Train for ``epochs`` (rounds) and return one row per epoch; ``figure``: also draw the
    final model's test masks (segmentation) or the clients' class counts (classification)."""
    started = time.perf_counter()
    model = task.build_model(seed)
    rows: list[dict] = []
    shards = [task.train] if clients == 1 else task.client_shards(clients, partition, seed)
    client_models = [task.build_model(seed) for _ in shards] if clients > 1 else [model]
    optimizers = [task.build_optimizer(m) for m in client_models]
    log(
        f"{task.name}: {task.describe()['model']}, {task.describe()['parameters']:,} parameters, "
        f"{len(task.train)} train / {len(task.test)} test, {clients} client(s) {[len(s) for s in shards]}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        losses, sizes = [], []
        global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for k, (m, opt, shard) in enumerate(zip(client_models, optimizers, shards, strict=True)):
            if clients > 1:
                m.load_state_dict(global_state)
            r = task.train_local(m, opt, shard, seed=seed * 1000 + epoch * 10 + k, epochs=local_epochs, batch_size=None)
            losses.append(r["train_loss"])
            sizes.append(len(shard))
        if clients > 1:
            model.load_state_dict(fedavg_average([m.state_dict() for m in client_models], sizes))
        train_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        metrics = task.final_metrics(model)
        eval_s = time.perf_counter() - t1
        row = {
            "epoch": epoch,
            "train_loss": sum(loss * n for loss, n in zip(losses, sizes, strict=True)) / sum(sizes),
            **score_line(task, metrics),
            "train_s": train_s,
            "eval_s": eval_s,
            "elapsed_s": time.perf_counter() - started,
        }
        rows.append(row)
        shown = " · ".join(
            f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "train_s", "eval_s", "elapsed_s")
        )
        log(
            f"epoch {epoch}/{epochs} · {shown} · train {train_s:.1f} s, eval {eval_s:.1f} s · "
            f"elapsed {row['elapsed_s']:.0f} s"
        )
    if figure:
        from trustformer.tasks.figures import mask_figure, partition_figure

        if task.name == "segmentation":
            mask_figure(
                task.sample_predictions(model, n=6),
                figure,
                title=f"{clients} client(s), {epochs} epoch(s): Dice {rows[-1]['dice']:.3f}",
            )
        else:
            partition_figure(
                task.shard_class_counts(shards),
                task.train.classes,
                figure,
                title=f"{partition} split over {clients} client(s)",
            )
        log(f"wrote {figure}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trustformer_lab.bench.image_tasks_bench", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--task", default="image", help="image | segmentation")
    ap.add_argument("--preset", default="small", help="tiny | small | paper")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a task option, e.g. --set lr=0.1 --set widths=[16,32,64]",
    )
    ap.add_argument("--epochs", type=int, default=5, help="epochs (centralized) or rounds (FedAvg)")
    ap.add_argument("--clients", type=int, default=1, help="1: centralized; N > 1: FedAvg over N clients")
    ap.add_argument("--partition", default="iid", help="iid | stratified | dirichlet (FedAvg only)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default="", help="also write one JSON line per epoch to this file")
    ap.add_argument("--figure", default="", help="PNG: test masks (segmentation) or class counts per client")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set expects KEY=VALUE; got {item!r}")
        overrides[key.strip()] = _parse_value(value.strip())
    if args.epochs < 1 or args.clients < 1:
        ap.error("--epochs and --clients must be ≥ 1")
    task = make_task(args.task, args.preset, overrides, args.seed)
    rows = run(
        task,
        epochs=args.epochs,
        clients=args.clients,
        partition=args.partition,
        local_epochs=args.local_epochs,
        seed=args.seed,
        log=lambda m: print(m, flush=True),
        figure=args.figure,
    )
    if args.json:
        with open(args.json, "w") as f:
            header = {
                "task": task.name,
                "preset": args.preset,
                "overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()},
                "clients": args.clients,
                "partition": args.partition,
                "threads": torch.get_num_threads(),
                "describe": task.describe(),
            }
            f.write(json.dumps(header) + "\n")
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
