"""``trustformer reproduce --paper fedpc``: FedPC's experiment grid — centralized, FedAvg, Phong and FedPC for N
workers on image classification and segmentation, class-stratified imbalanced and Dirichlet splits — planned, run
through the grid runner of :mod:`trustformer.reproduce.grid` (cached the same way), then its Tables 2-4 and Fig. 6
(``report/fedpc.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trustformer import config as config_module
from trustformer.config import ConfigError, RunConfig, load_config

from .grid import GridResult, PlannedRun, cache_key, is_cached, machine_info, run_grid, write_grid_record

log = logging.getLogger(__name__)

FEDPC_STRATEGIES = ("centralized", "fedavg", "phong", "fedpc")  # the methods of FedPC's Tables 1-4
FEDPC_TASKS = ("image-classification", "segmentation")
FEDPC_PARTITIONS = ("stratified", "dirichlet")  # Tables 2-3 (IID-imbalanced) and Table 4 (Dirichlet)
_TASK_SHORT = {"image-classification": "image", "segmentation": "seg"}


@dataclass(frozen=True)
class FedPCGridSpec:
    """FedPC's grid: every strategy for every number of workers N, task and partition.

    ``dirichlet`` applies to image classification only (segmentation has no classes: the paper's
    Table 4 is CIFAR-10 only); ``centralized`` runs once per task (N and the split change nothing).
    ``task_rounds`` and ``task_settings`` are per task; ``rounds`` (when set) wins over ``task_rounds``.
    """

    strategies: tuple[str, ...] = FEDPC_STRATEGIES
    clients: tuple[int, ...] = (3, 5, 10)
    tasks: tuple[str, ...] = FEDPC_TASKS
    partitions: tuple[str, ...] = FEDPC_PARTITIONS
    rounds: int | None = None
    task_rounds: tuple[tuple[str, int], ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()
    task_settings: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def rounds_of(self, task: str) -> int | None:
        return self.rounds if self.rounds is not None else dict(self.task_rounds).get(task)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "paper": "fedpc",
            "strategies": ", ".join(self.strategies),
            "workers N": ", ".join(map(str, self.clients)),
            "tasks": ", ".join(self.tasks),
            "partitions": ", ".join(self.partitions),
            "rounds": "; ".join(f"{t} {self.rounds_of(t) or 'as the preset'}" for t in self.tasks),
            "settings": ", ".join(f"{k}={v}" for k, v in self.settings) or "none",
        }
        for task, values in self.task_settings:
            if task in self.tasks and values:
                d[f"settings ({task})"] = ", ".join(f"{k}={v}" for k, v in values)
        return d


def default_fedpc_grid(preset: str) -> FedPCGridSpec:
    """The grid run by ``reproduce --paper fedpc --preset PRESET`` when no option narrows it."""
    if preset == "tiny":  # seconds per run, well under a minute in all (tests/test_reproduce_fedpc.py)
        # 2 epochs: the bytes of Fig. 6 are those of an epoch that is not Phong's last (which also sends
        # the final model to every worker); models a little wider than the tiny preset's so that the
        # control records stay well under 1% of an epoch's bytes, as with the paper's 35 MB models
        return FedPCGridSpec(
            clients=(3,),
            task_rounds=(("image-classification", 2), ("segmentation", 2)),
            settings=(("runtime.threads", 1),),
            task_settings=(
                ("image-classification", (("image.widths", [16, 32]),)),
                ("segmentation", (("segmentation.base_width", 8),)),
            ),
        )
    if preset == "small":  # Fashion-MNIST (12,000 training images) and MRI brain extraction, CPU (docs/reproduction.md)
        return FedPCGridSpec(
            task_rounds=(("image-classification", 3), ("segmentation", 10)),
            settings=(("runtime.threads", 1),),
            task_settings=(("image-classification", (("image.train_size", 12000),)),),
        )
    # paper: CIFAR-10 and LGG (data folders to give with --set), the preset's epochs (250 and 35; a GPU)
    return FedPCGridSpec()


def check_fedpc_grid(grid: FedPCGridSpec) -> None:
    """ConfigError naming the ``reproduce`` option for a grid FedPC's tables cannot be made from."""
    if not grid.strategies:
        raise ConfigError("--strategies: no strategy given")
    for s in grid.strategies:
        if s not in FEDPC_STRATEGIES:
            raise ConfigError(
                f"--strategies: {s!r} is not a method of FedPC's tables (--paper fedpc runs "
                f"{', '.join(FEDPC_STRATEGIES)})"
            )
        if s not in config_module.STRATEGIES:  # pragma: no cover - an installation without the protocol
            raise ConfigError(f"--strategies: {s!r} is not implemented by this installation")
    if not grid.tasks:
        raise ConfigError("--tasks: no task given")
    for t in grid.tasks:
        if t not in FEDPC_TASKS:
            raise ConfigError(f"--tasks: {t!r} is not one of FedPC's tasks ({', '.join(FEDPC_TASKS)})")
    if not grid.partitions:
        raise ConfigError("--partitions: no partition given")
    for p in grid.partitions:
        if p not in FEDPC_PARTITIONS:
            raise ConfigError(
                f"--partitions: {p!r} is not one of FedPC's splits ({', '.join(FEDPC_PARTITIONS)}: "
                "class-stratified imbalanced shares, Tables 2-3; label skew, Table 4)"
            )
    if grid.partitions == ("dirichlet",) and grid.tasks == ("segmentation",):
        raise ConfigError(
            "--partitions: dirichlet splits by class and applies to image-classification only "
            "(segmentation has no classes)"
        )
    if not grid.clients:
        raise ConfigError("--clients: no number of workers given")
    bad = [n for n in grid.clients if isinstance(n, bool) or not isinstance(n, int) or n < 2]
    if bad:
        raise ConfigError(f"--clients: {bad[0]!r} workers; FedPC's tables need N >= 2")
    if grid.rounds is not None and grid.rounds < 1:
        raise ConfigError(f"--rounds {grid.rounds} must be >= 1")


def plan_fedpc(
    preset: str,
    grid: FedPCGridSpec,
    results: str | Path,
    *,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[PlannedRun]:
    """The runs of FedPC's ``grid`` on ``preset`` (``overrides``: dotted keys applied to every run)."""
    check_fedpc_grid(grid)
    runs_dir = Path(results) / "runs"
    task_settings = dict(grid.task_settings)
    settings: list[tuple[str, dict[str, Any]]] = []
    for task in grid.tasks:
        partitions = [p for p in grid.partitions if p in config_module.TASK_PARTITIONS[task]]
        if not partitions:
            continue
        for strategy in grid.strategies:
            if strategy == "centralized":
                n = min(grid.clients)
                settings.append(
                    (
                        f"{task} · centralized",
                        {
                            "task": task,
                            "federation.strategy": strategy,
                            "federation.clients": n,
                            "data.partition": partitions[0],
                        },
                    )
                )
                continue
            for partition in partitions:
                for n in grid.clients:
                    settings.append(
                        (
                            f"{task} · {strategy} · N={n} · {partition}",
                            {
                                "task": task,
                                "federation.strategy": strategy,
                                "federation.clients": n,
                                "data.partition": partition,
                            },
                        )
                    )
    planned: list[PlannedRun] = []
    seen: set[str] = set()
    for title, s in settings:
        task = s["task"]
        values = dict(grid.settings)
        values.update(task_settings.get(task, ()))
        values.update(overrides or {})
        if grid.rounds_of(task) is not None:
            values["federation.rounds"] = grid.rounds_of(task)
        values.update(s)
        values["out"] = "(set below)"
        cfg = load_config(preset, config_file, values)
        key = cache_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        name = f"{_TASK_SHORT[task]}-{s['federation.strategy']}"
        if s["federation.strategy"] != "centralized":
            name += f"-{s['data.partition']}-n{s['federation.clients']}"
        name += f"-{key[:8]}"
        folder = runs_dir / name
        cfg = load_config(preset, config_file, {**values, "out": str(folder)})
        planned.append(PlannedRun(name=name, overrides=s, cfg=cfg, key=key, folder=folder, title=title))
    return planned


def reproduce_fedpc(
    preset: str,
    results: str | Path,
    *,
    grid: FedPCGridSpec | None = None,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    force: bool = False,
    runner: Callable[[RunConfig], dict[str, Any]] | None = None,
    command: str | None = None,
) -> GridResult:
    """FedPC's grid: plan, run (reusing cached runs), then its Tables 2-4 and Fig. 6 in ``results``."""
    from ..report.fedpc import build_fedpc_report

    grid = grid or default_fedpc_grid(preset)
    results = Path(results)
    planned = plan_fedpc(preset, grid, results, config_file=config_file, overrides=overrides)
    host = machine_info()
    outcome = run_grid(planned, results, force=force, runner=runner)
    host["load_average_after"] = machine_info().get("load_average")
    finished = [r for r in planned if is_cached(r)]
    subset = (
        f"preset {preset}; FedPC's paper; strategies {', '.join(grid.strategies)}; "
        f"N = {', '.join(map(str, grid.clients))}; tasks {', '.join(grid.tasks)}; "
        f"partitions {', '.join(grid.partitions)}; {len(planned)} run(s)"
        + (f", {len(outcome.failed)} failed: " + ", ".join(outcome.failed) if outcome.failed else "")
    )
    context = write_grid_record(
        results, command, subset, {"preset": preset, **grid.describe()}, overrides, planned, outcome, host
    )
    if finished:
        outcome.report = build_fedpc_report([r.folder for r in finished], results, context=context)
    else:
        log.error("no run finished: no report written")
    return outcome


__all__ = [
    "FEDPC_PARTITIONS",
    "FEDPC_STRATEGIES",
    "FEDPC_TASKS",
    "FedPCGridSpec",
    "check_fedpc_grid",
    "default_fedpc_grid",
    "plan_fedpc",
    "reproduce_fedpc",
]
