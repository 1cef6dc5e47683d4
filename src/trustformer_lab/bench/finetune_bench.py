"""`trustformer bench finetune`: each owner's free fine-tuning of a finished run's final model, swept without
rerunning the federation.

Fine-tuning after the last exchange never leaves the owner's machine: it spends no ε and sends nothing
(``privacy.finetune = "free"``, docs/privacy.md). So an owner may choose its recipe after the run ends. For each
``--epochs`` × ``--rate`` setting, every owner fine-tunes a copy of the run's saved final model (LoRA adapters
merged in, every weight trained: ``federation.finetune_params = "all"``) on its own shard with the task's own
``finetune`` (constant rate ``train.lr`` × rate), and is scored on its own held-out data and on the shared test set.

``--public`` adds the control every verdict needs: the same fine-tuning of the **public start** alone, that is
training alone with the fine-tuning's recipe. A federation is worth joining only where its owners end better than
that row.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from pathlib import Path
from statistics import mean
from typing import Any

import torch

from trustformer.core.shared import derive_seed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench finetune",
        description="Free fine-tuning of a finished run's final model by each owner, swept over epochs x rate "
        "(module docstring of trustformer.bench.finetune_bench; docs/privacy.md).",
    )
    p.add_argument("run", help="a finished run folder (the --out of `trustformer run` or of a bench row)")
    p.add_argument("--epochs", default="1,2,3", help="fine-tuning epochs to try, comma-separated (default: 1,2,3)")
    p.add_argument("--rate", default="0.1,0.25", help="rates as a fraction of train.lr (default: 0.1,0.25)")
    p.add_argument("--clients", default="", help="owners to fine-tune, comma-separated (default: every owner)")
    p.add_argument("--public", action="store_true", help="also fine-tune the public start alone (the control)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    return p.parse_args(argv)


def _numbers(text: str, kind: type, option: str, *, ids: bool = False) -> list[Any]:
    """Comma-separated positive numbers (``ids``: client ids, 0 and up)."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{option} {text!r}: give comma-separated numbers") from None
    if not values or any(v < 0 or (v == 0 and not ids) for v in values):
        raise SystemExit(f"{option} {text!r}: give {'client ids (0, 1, ...)' if ids else 'positive numbers'}")
    return values


def starting_models(run: Path, cfg: Any, public: bool) -> dict[str, torch.nn.Module]:
    """The run's saved final model (every owner's, when they differ), and with ``public`` the public model the run
    began from (by the cache key its ``summary.json`` records)."""
    from trustformer.export import load_translation_model
    from trustformer.export.run_folders import find_models
    from trustformer.tasks.public import cached_state
    from trustformer.tasks.translation_workload import initial_model, load_workload

    loaded: dict[Path, torch.nn.Module] = {}  # owners holding the same model share its folder: load it once
    starts: dict[str, torch.nn.Module] = {}
    for client, folder in find_models(run).items():
        if folder not in loaded:
            loaded[folder] = load_translation_model(folder)[0]
        starts[f"client-{client}"] = loaded[folder]
    if public:
        if cfg.train.init != "public":
            raise SystemExit(f"--public: {run} did not start from the public model (train.init = {cfg.train.init!r})")
        keys = {
            c.get("public_model") for c in json.loads((run / "summary.json").read_text())["data"]["clients"].values()
        }
        if len(keys) != 1 or None in keys:
            raise SystemExit(f"--public: {run}/summary.json does not name the one public model its owners began from")
        start = initial_model(cfg, load_workload(cfg))  # the model's shape; its weights are replaced next
        start.load_state_dict(cached_state(cfg, keys.pop()))
        starts["public"] = start
    return starts


def sweep(run: Path, epochs: list[int], rates: list[float], clients: list[int], public: bool) -> list[dict]:
    """One row per (start, epochs, rate): the owners' mean own-data loss and BLEU, and shared test loss, BLEU and
    chrF, after it."""
    from trustformer.config.load import build_config
    from trustformer.tasks.run import load_task

    summary = run / "summary.json"
    if not summary.is_file():
        raise SystemExit(f"{run} has no summary.json: pass the folder of a finished run")
    cfg = build_config(json.loads(summary.read_text(encoding="utf-8"))["config"])
    if cfg.task != "translation":
        raise SystemExit(f"{run}: bench finetune scores translation runs (own held-out pairs); this is {cfg.task}")
    cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, finetune="free"))
    task = load_task(cfg)
    starts = starting_models(run, cfg, public)
    held = sorted(int(k.split("-")[1]) for k in starts if k.startswith("client-"))
    if set(clients) - set(held):
        raise SystemExit(f"--clients {clients}: {run} holds the models of owners {held}")
    owners = clients or held
    rows = []
    for name in ["run", "public"] if public else ["run"]:
        settings = [(0, 0.0)] + [(e, r) for e in epochs for r in rates]
        for n_epochs, rate in settings:
            scores = []
            for client in owners:
                model = copy.deepcopy(starts["public" if name == "public" else f"client-{client}"])
                started = time.perf_counter()
                if n_epochs:
                    seed = derive_seed(cfg.seed, "finetune", client, cfg.federation.rounds)
                    task.finetune(model, task.shard(client), epochs=n_epochs, lr_scale=rate, seed=seed)
                own = task.own_metrics(model, client)
                if not own:
                    raise SystemExit(f"{run}: the owners hold no own test data: rerun with data.own_test_size > 0")
                quick = task.quick_scores(model)  # the shared test set's BLEU: judge on translations too
                scores.append(
                    (
                        own["own_test_loss"],
                        own["own_bleu"],
                        task.test_loss(model),
                        started,
                        quick["bleu"],
                        quick["chrf"],
                    )
                )
            rows.append(
                {
                    "start": name,
                    "epochs": n_epochs,
                    "rate": rate,
                    "own_loss": mean(s[0] for s in scores),
                    "own_bleu": mean(s[1] for s in scores),
                    "test_loss": mean(s[2] for s in scores),
                    "test_bleu": mean(s[4] for s in scores),
                    "test_chrf": mean(s[5] for s in scores),
                    "seconds": time.perf_counter() - scores[0][3],
                    "own_loss_per_owner": [s[0] for s in scores],
                }
            )
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    return (
        f"{row['start']:<7} {row['epochs']:>6} {row['rate']:>5.2f} {row['own_loss']:>9.3f} {row['own_bleu']:>9.1f}"
        f" {row['test_loss']:>9.3f} {row['test_bleu']:>9.1f} {row['test_chrf']:>9.1f} {row['seconds']:>9.0f}  "
        + " ".join(f"{x:.3f}" for x in row["own_loss_per_owner"])
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Path(args.run)
    epochs = _numbers(args.epochs, int, "--epochs")
    rates = _numbers(args.rate, float, "--rate")
    clients = _numbers(args.clients, int, "--clients", ids=True) if args.clients else []
    print(f"free fine-tuning of {run} (epochs 0 = the model as it is; own loss per owner at the end)")
    names = ("own loss", "own BLEU", "test loss", "test BLEU", "test chrF", "seconds")
    print(f"{'start':<7} {'epochs':>6} {'rate':>5} " + " ".join(f"{n:>9}" for n in names))
    rows = sweep(run, epochs, rates, clients, args.public)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": str(run), "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0
