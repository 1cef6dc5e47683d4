"""``trustformer reproduce``: a paper's experiment grid on a preset, cached, then the report.

Two papers: Trustformer's (the default, ``reproduce``) and FedPC's (``reproduce_fedpc``, ``--paper
fedpc``: centralized, FedAvg, Phong and FedPC for N workers on image classification and segmentation,
class-stratified imbalanced and Dirichlet splits; its Tables 2-4 and Fig. 6, ``report/fedpc.py``).

Trustformer's grid (a configurable subset of the paper's): every strategy of ``strategies`` once with
Agg_fr = 1 (Trustformer once per β of ``betas``), plus, for the strategies of ``agg_strategies``,
one run per other aggregation frequency of ``agg_every`` (Trustformer at the β of ``agg_betas``).
Strategies that never exchange (local, centralized) run once.

The results folder is a cache: run ``<name>-<key>`` lives in ``<results>/runs/`` and is reused when
its ``summary.json`` exists and was produced by the same configuration (the key is a hash of the
full resolved configuration less the output folder and the progress switch). A changed setting gives
a new key, hence a new run; a run that crashed (no summary) is run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trustformer import config as config_module
from trustformer.config import ConfigError, RunConfig, load_config
from trustformer.recording.recorder import fmt_s

log = logging.getLogger(__name__)

PAPERS = ("trustformer", "fedpc")  # what `reproduce --paper` accepts; trustformer is the default

# preferred order; only those that trustformer.config.STRATEGIES knows are used
PAPER_STRATEGIES = ("fedavg", "dp-fedavg", "dp-fedsam", "dp-blur-lus", "trustformer", "local", "centralized")
NON_EXCHANGING = ("local", "centralized")


# the paper's protocol: no privacy floor (its β sweep reaches 0.9), k-means of the trained weights
PAPER_TRUSTFORMER = {"trustformer.min_cluster_rows": 1, "trustformer.memberships": "local"}


def available_strategies(wanted: Sequence[str] = PAPER_STRATEGIES) -> tuple[str, ...]:
    """The strategies of ``wanted`` that this installation implements (DP baselines when present)."""
    return tuple(s for s in wanted if s in config_module.STRATEGIES)


@dataclass(frozen=True)
class GridSpec:
    strategies: tuple[str, ...]
    betas: tuple[float, ...] = (0.1, 0.5, 0.9)
    agg_every: tuple[int, ...] = (1,)
    agg_betas: tuple[float, ...] = (0.5,)
    agg_strategies: tuple[str, ...] = ("fedavg", "trustformer")
    rounds: int | None = None  # None = the preset's
    settings: tuple[tuple[str, Any], ...] = ()  # (dotted key, value) for every run; --set wins over them
    # the DP baselines under both readings of the paper's clipping (docs/privacy.md): its clients' updates
    # (user level, privacy.unit = client) and each training record (DP-SGD, privacy.unit = record)
    dp_units: tuple[str, ...] = ("client", "record")

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["rounds"] = self.rounds if self.rounds is not None else "preset"
        d["settings"] = ", ".join(f"{k}={v}" for k, v in self.settings) or "none"
        return {k: (", ".join(map(str, v)) if isinstance(v, tuple) else v) for k, v in d.items()}


def default_grid(preset: str) -> GridSpec:
    """The grid run by ``reproduce --preset PRESET`` when no option narrows it."""
    every = available_strategies()
    if preset == "tiny":  # seconds per run: every strategy, three β, and Agg_fr 2 for FedAvg and β = 0.5
        # one torch thread: a model this small gains nothing from two, and on a busy machine two threads
        # wait on each other (seen: 20 s instead of 0.7 s for the same run)
        return GridSpec(
            strategies=every,
            betas=(0.1, 0.5, 0.9),
            agg_every=(1, 2),
            agg_betas=(0.5,),
            settings=(("runtime.threads", 1),),
        )
    if preset == "small":  # about 5 minutes per run on 2 busy CPU cores: under an hour (docs/reproduction.md)
        return GridSpec(
            strategies=tuple(s for s in every if s != "centralized"),
            betas=(0.1, 0.5, 0.9),
            agg_every=(1,),
            rounds=3,
            settings=(("runtime.threads", 1),),
        )
    # paper: the paper's full grid (a GPU)
    return GridSpec(
        strategies=every,
        betas=tuple(round(0.1 * i, 1) for i in range(1, 10)),
        agg_every=(1, 2, 5, 10),
        agg_betas=(0.5,),
    )


@dataclass(frozen=True)
class PlannedRun:
    name: str
    overrides: dict[str, Any]  # the grid's settings for this run (dotted keys)
    cfg: RunConfig
    key: str
    folder: Path
    title: str = ""  # the progress lines' name of the run ("" = from strategy, β and Agg_fr)

    @property
    def label(self) -> str:
        if self.title:
            return self.title
        fed = self.cfg.federation
        text = fed.strategy
        if fed.strategy == "trustformer":
            text += f" β={self.cfg.section('trustformer').beta:g}"
        if fed.strategy.startswith("dp-"):
            text += f" ({self.cfg.privacy.unit} level)"
        if fed.strategy not in NON_EXCHANGING:
            text += f" Agg_fr={fed.agg_every}"
        return text


def cache_key(cfg: RunConfig | Mapping[str, Any]) -> str:
    """Hash of the full resolved configuration, less ``out`` and ``runtime.progress`` (which change
    nothing a run computes)."""
    values = json.loads(cfg.to_json()) if isinstance(cfg, RunConfig) else json.loads(json.dumps(cfg))
    values.pop("out", None)
    values.get("runtime", {}).pop("progress", None)
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


def plan(
    preset: str,
    grid: GridSpec,
    results: str | Path,
    *,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[PlannedRun]:
    """The runs of ``grid`` on ``preset`` (``overrides``: dotted keys applied to every run)."""
    unknown = [s for s in grid.strategies if s not in config_module.STRATEGIES]
    if unknown:
        raise ConfigError(f"strategy {unknown[0]!r} is not one of: {', '.join(config_module.STRATEGIES)}")
    runs_dir = Path(results) / "runs"
    settings: list[dict[str, Any]] = []
    for strategy in grid.strategies:
        if strategy in NON_EXCHANGING:
            settings.append({"federation.strategy": strategy})
            continue
        if strategy == "trustformer":
            settings += [
                {"federation.strategy": strategy, "trustformer.beta": b, "federation.agg_every": 1, **PAPER_TRUSTFORMER}
                for b in grid.betas
            ]
        elif strategy.startswith("dp-"):
            settings += [
                {"federation.strategy": strategy, "federation.agg_every": 1, "privacy.unit": unit}
                for unit in grid.dp_units
            ]
        else:
            settings.append({"federation.strategy": strategy, "federation.agg_every": 1})
        if strategy in grid.agg_strategies:
            for a in grid.agg_every:
                if a == 1:
                    continue
                if strategy == "trustformer":
                    settings += [
                        {
                            "federation.strategy": strategy,
                            "trustformer.beta": b,
                            "federation.agg_every": a,
                            **PAPER_TRUSTFORMER,
                        }
                        for b in grid.agg_betas
                    ]
                else:
                    settings.append({"federation.strategy": strategy, "federation.agg_every": a})
    planned: list[PlannedRun] = []
    seen: set[str] = set()
    for s in settings:
        values = {"eval.diagnostics": True, **dict(grid.settings)}  # the tables' distance to FedAvg
        values.update(overrides or {})
        if grid.rounds is not None:
            values["federation.rounds"] = grid.rounds
        values.update(s)
        values["out"] = "(set below)"
        cfg = load_config(preset, config_file, values)
        key = cache_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        name = _run_name(cfg) + f"-{key[:8]}"
        folder = runs_dir / name
        cfg = load_config(preset, config_file, {**values, "out": str(folder)})
        planned.append(PlannedRun(name=name, overrides=s, cfg=cfg, key=key, folder=folder))
    return planned


def _run_name(cfg: RunConfig) -> str:
    fed = cfg.federation
    name = fed.strategy
    if fed.strategy == "trustformer":
        name += f"-beta{cfg.section('trustformer').beta:g}"
    if fed.strategy not in NON_EXCHANGING:
        name += f"-agg{fed.agg_every}"
    return name


def is_cached(run: PlannedRun) -> bool:
    """True when the run's folder holds a summary produced by the same configuration."""
    path = run.folder / "summary.json"
    if not path.is_file():
        return False
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary.get("config"), dict) and cache_key(summary["config"]) == run.key


@dataclass
class GridResult:
    results: Path
    runs: list[PlannedRun]
    status: dict[str, str] = field(default_factory=dict)  # name -> cached | ran | failed
    seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    report: Any = None

    @property
    def failed(self) -> list[str]:
        return [n for n, s in self.status.items() if s == "failed"]


def machine_info() -> dict[str, Any]:
    """What the report says about the host: CPU model, cores, memory, load."""
    info: dict[str, Any] = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text(encoding="utf-8").splitlines()[0].split()
        info["memory_gib"] = round(int(mem[1]) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    with contextlib.suppress(OSError):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def run_grid(
    planned: Sequence[PlannedRun],
    results: str | Path,
    *,
    force: bool = False,
    runner: Callable[[RunConfig], dict[str, Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> GridResult:
    """Run every planned run that is not cached (all with ``force``), one after another, logging
    which run of how many is going, and the elapsed time and ETA of the grid."""
    if runner is None:
        from trustformer.engine.inprocess import run_in_process

        runner = run_in_process
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    out = GridResult(results=results, runs=list(planned))
    todo = [r for r in planned if force or not is_cached(r)]
    cached = len(planned) - len(todo)
    log.info("grid: %d run(s), %d cached in %s, %d to run", len(planned), cached, results, len(todo))
    started = clock()
    done_fresh: list[float] = []
    position = 0
    for i, run in enumerate(planned, 1):
        if run not in todo:
            out.status[run.name] = "cached"
            log.info("[run %d/%d] %s · cached (%s)", i, len(planned), run.label, run.folder)
            continue
        position += 1
        elapsed = clock() - started
        remaining = len(todo) - position + 1
        eta = f"ETA {fmt_s(sum(done_fresh) / len(done_fresh) * remaining)}" if done_fresh else "ETA after the first run"
        log.info(
            "[run %d/%d] %s · starting (%d of %d to run) · elapsed %s · %s",
            i,
            len(planned),
            run.label,
            position,
            len(todo),
            fmt_s(elapsed),
            eta,
        )
        run_started = clock()
        try:
            summary = runner(run.cfg)
        except Exception as exc:  # one failed run does not lose the others
            seconds = clock() - run_started
            out.status[run.name], out.seconds[run.name] = "failed", seconds
            out.errors[run.name] = f"{type(exc).__name__}: {exc}"
            run.folder.mkdir(parents=True, exist_ok=True)
            (run.folder / "error.txt").write_text(out.errors[run.name] + "\n", encoding="utf-8")
            log.error(
                "[run %d/%d] %s · failed after %s: %s",
                i,
                len(planned),
                run.label,
                fmt_s(seconds),
                out.errors[run.name],
            )
            continue
        seconds = clock() - run_started
        done_fresh.append(seconds)
        out.status[run.name], out.seconds[run.name] = "ran", seconds
        (run.folder / "error.txt").unlink(missing_ok=True)
        log.info("[run %d/%d] %s · done in %s · %s", i, len(planned), run.label, fmt_s(seconds), _scores_str(summary))
    log.info(
        "grid done in %s: %d ran, %d cached, %d failed",
        fmt_s(clock() - started),
        sum(1 for s in out.status.values() if s == "ran"),
        cached,
        len(out.failed),
    )
    return out


def _scores_str(summary: Mapping[str, Any]) -> str:
    """The done line's scores: test loss, then BLEU (translation), accuracy or Dice and pixel accuracy."""
    text = f"test loss {_mean_str(summary.get('test_loss') or [], 3)}"
    task = summary.get("task", "translation")
    if task == "image-classification":
        return text + f" · accuracy {_mean_str(summary.get('accuracy') or [], 4)}"
    if task == "segmentation":
        return (
            text + f" · Dice {_mean_str(summary.get('dice') or [], 4)}"
            f" · pixel accuracy {_mean_str(summary.get('pixel_accuracy') or [], 4)}"
        )
    return text + f" · BLEU {_mean_str(summary.get('bleu') or [], 2)}"


def _mean_str(values: Sequence[float | None], digits: int) -> str:
    vals = [v for v in values if v is not None]
    return f"{sum(vals) / len(vals):.{digits}f}" if vals else "—"


def write_grid_record(
    results: Path,
    command: str | None,
    subset: str,
    grid: dict[str, Any],
    overrides: Mapping[str, Any] | None,
    planned: Sequence[PlannedRun],
    outcome: GridResult,
    host: dict[str, Any],
) -> dict[str, Any]:
    """Write ``grid.json`` (what ran, how, on which machine, each run's status) and return the report's
    context (the same, with each run's folder)."""
    if overrides:
        grid = {**grid, "overrides": ", ".join(f"{k}={v}" for k, v in overrides.items())}
    context = {
        "command": command,
        "subset": subset,
        "grid": grid,
        "runs": [
            {"folder": str(r.folder), "status": outcome.status.get(r.name), "seconds": outcome.seconds.get(r.name)}
            for r in planned
        ],
        "machine": host,
    }
    (results / "grid.json").write_text(
        json.dumps(
            {
                **context,
                "runs": [
                    {
                        "name": r.name,
                        "key": r.key,
                        "label": r.label,
                        "overrides": r.overrides,
                        "status": outcome.status.get(r.name),
                        "seconds": outcome.seconds.get(r.name),
                        "error": outcome.errors.get(r.name),
                    }
                    for r in planned
                ],
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    return context


def reproduce(
    preset: str,
    results: str | Path,
    *,
    grid: GridSpec | None = None,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    force: bool = False,
    epochs: int = 10,
    runner: Callable[[RunConfig], dict[str, Any]] | None = None,
    command: str | None = None,
) -> GridResult:
    """Plan, run (reusing cached runs) and report the grid; the report goes to ``results``."""
    from ..report import build_report

    grid = grid or default_grid(preset)
    results = Path(results)
    planned = plan(preset, grid, results, config_file=config_file, overrides=overrides)
    if planned and runner is None:  # before any training: the metrics the runs need can be computed
        from trustformer.tasks.checks import check_metrics

        check_metrics(planned[0].cfg)
    host = machine_info()
    outcome = run_grid(planned, results, force=force, runner=runner)
    host["load_average_after"] = machine_info().get("load_average")
    finished = [r for r in planned if (r.folder / "summary.json").is_file() and is_cached(r)]
    subset = (
        f"preset {preset}; strategies {', '.join(grid.strategies)}; β sweep {', '.join(map(str, grid.betas))}"
        f" (Agg_fr = 1); Agg_fr {', '.join(map(str, grid.agg_every))} for "
        f"{', '.join(s for s in grid.agg_strategies if s in grid.strategies) or 'none'}"
        + (
            f" (Trustformer at β = {', '.join(map(str, grid.agg_betas))})"
            if "trustformer" in grid.agg_strategies and len(grid.agg_every) > 1
            else ""
        )
        + f"; rounds {grid.rounds if grid.rounds is not None else 'as the preset'}; "
        f"{len(planned)} run(s)"
        + (f", {len(outcome.failed)} failed: " + ", ".join(outcome.failed) if outcome.failed else "")
    )
    context = write_grid_record(
        results,
        command,
        subset,
        {"preset": preset, **grid.describe(), "Eq. 5 epochs": epochs},
        overrides,
        planned,
        outcome,
        host,
    )
    if finished:
        outcome.report = build_report([r.folder for r in finished], results, context=context, epochs=epochs)
    else:
        log.error("no run finished: no report written")
    return outcome


__all__ = [
    "GridSpec",
    "GridResult",
    "PAPERS",
    "PlannedRun",
    "available_strategies",
    "cache_key",
    "default_grid",
    "is_cached",
    "machine_info",
    "plan",
    "reproduce",
    "run_grid",
    "write_grid_record",
]
