"""Finished run folders (``summary.json`` + ``metrics.jsonl``) as the report reads them."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trustformer.errors import TrustformerError

from .paper import NAMES, ORDER, paper_key

# per-row phase times that are not client-side exchange work
_NOT_EXCHANGE = {"train_s", "eval_s", "aggregate_s", "memberships_s"}  # memberships_s is part of cluster_s


class ReportError(TrustformerError, ValueError):
    """The folders given hold no usable run, or a run folder is malformed."""


@dataclass
class RunResult:
    """One finished run: its summary, its per-(round, client) records and its events."""

    path: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    label_suffix: str = ""  # set when two runs would otherwise share a label

    # ---------------------------------------------------------------- identity
    @property
    def config(self) -> dict[str, Any]:
        return self.summary.get("config", {})

    @property
    def task(self) -> str:
        """``translation`` (also for runs from before the task layer), ``image-classification`` or ``segmentation``."""
        return str(self.summary.get("task", self.config.get("task", "translation")))

    @property
    def strategy(self) -> str:
        return str(self.summary.get("strategy", self.config.get("federation", {}).get("strategy", "?")))

    @property
    def beta(self) -> float | None:
        if self.strategy != "trustformer":
            return None
        beta = self.summary.get("beta", self.config.get("federation", {}).get("beta"))
        return float(beta) if beta is not None else None

    @property
    def agg_every(self) -> int:
        return int(self.config.get("federation", {}).get("agg_every", 1))

    @property
    def memberships(self) -> str:
        """Trustformer's membership mode ("local" = the paper's k-means of the trained weights)."""
        return str(self.config.get("federation", {}).get("memberships", "shared"))

    @property
    def exchanges(self) -> bool:
        return self.strategy not in ("local", "centralized")

    @property
    def rounds(self) -> int:
        return int(self.summary.get("rounds", 0))

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", self.config.get("seed", 0)))

    @property
    def client_ids(self) -> list[int]:
        return [int(c) for c in self.summary.get("client_ids", [])]

    @property
    def paper_key(self) -> str | None:
        """Key into the paper's tables, for runs set up like the paper's (Agg_fr = 1)."""
        if self.agg_every != 1 and self.exchanges:
            return None
        return paper_key(self.strategy, self.beta)

    @property
    def privacy_unit(self) -> str:
        """``client`` (user-level DP of the DP baselines) or ``record`` (DP-SGD of every record)."""
        return str(self.config.get("privacy", {}).get("unit", "client"))

    @property
    def noise_not_private(self) -> bool:
        """A DP run whose noise and client sampling were derived from the run seed
        (``privacy.noise_source = "seeded-not-private"``): anyone who knows the seed can remove the noise."""
        privacy = self.summary.get("privacy")
        return isinstance(privacy, dict) and privacy.get("noise_source") == "seeded-not-private"

    @property
    def label(self) -> str:
        name = NAMES.get(self.strategy, self.strategy)
        if self.beta is not None:
            name += f" β={self.beta:g}"
        if self.exchanges and self.agg_every != 1:
            name += f", Agg_fr={self.agg_every}"
        if self.privacy_unit == "record" and self.strategy.startswith("dp-"):
            name += " (record level)"
        if self.noise_not_private:
            name += " (seeded noise: NOT private)"
        return name + self.label_suffix

    def sort_key(self) -> tuple:
        order = ORDER.index(self.strategy) if self.strategy in ORDER else len(ORDER)
        return (order, self.beta if self.beta is not None else -1.0, self.agg_every, str(self.path))

    # ---------------------------------------------------------------- measurements
    def per_client(self, key: str) -> list[float | None]:
        values = self.summary.get(key)
        if not isinstance(values, list):
            return [None] * len(self.client_ids)
        return [None if v is None else float(v) for v in values]

    def mean(self, key: str) -> float | None:
        return _mean(self.per_client(key))

    def loss_curves(self) -> dict[int, list[tuple[int, float]]]:
        """client -> [(round, test loss)] from metrics.jsonl."""
        curves: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for r in self.records:
            if r.get("test_loss") is not None:
                curves[int(r["client"])].append((int(r["round"]), float(r["test_loss"])))
        return {c: sorted(v) for c, v in sorted(curves.items())}

    def exchanged_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("exchanged")]

    def bytes_per_exchange(self) -> tuple[float | None, float | None]:
        """Mean bytes up and down per client in an exchange round (control-only rounds excluded)."""
        rows = self.exchanged_rows() or self.records
        if not rows:
            return None, None
        return (statistics.fmean(r["bytes_up"] for r in rows), statistics.fmean(r["bytes_down"] for r in rows))

    def model_bytes(self) -> float | None:
        value = self.summary.get("bytes", {}).get("fedavg_model_bytes")
        return float(value) if value else None

    def epoch_times(self) -> dict[str, float]:
        """Per-epoch times for Table IV and Eq. 5, from metrics.jsonl (seconds).

        ``train``: max over clients of the client's mean local-training time per round (clients work
        in parallel in a deployment; Eq. 5's max_i T_l). ``cluster``: max over clients of the mean
        k-means time per exchange. ``other``: max over clients of the other client-side exchange work
        per exchange (applying the aggregate, estimating weights, clipping and noise). ``client_exchange``:
        max over clients of cluster + other (Eq. 5's max_i T_c). ``aggregate``: the server's mean
        aggregation time per exchange (T_agg). ``total``: train + client_exchange + aggregate, i.e. one
        epoch with an exchange.
        """
        train: dict[int, list[float]] = defaultdict(list)
        cluster: dict[int, list[float]] = defaultdict(list)
        other: dict[int, list[float]] = defaultdict(list)
        aggregate: dict[int, float] = {}
        for r in self.records:
            client = int(r["client"])
            if "train_s" in r:
                train[client].append(float(r["train_s"]))
            if r.get("exchanged"):
                cluster[client].append(float(r.get("cluster_s", 0.0)))
                other[client].append(
                    sum(
                        float(v)
                        for k, v in r.items()
                        if k.endswith("_s")
                        and k not in _NOT_EXCHANGE
                        and k != "cluster_s"
                        and isinstance(v, (int, float))
                    )
                )
                if "aggregate_s" in r:
                    aggregate[int(r["round"])] = float(r["aggregate_s"])
        t_train = max((statistics.fmean(v) for v in train.values() if v), default=0.0)
        t_cluster = max((statistics.fmean(v) for v in cluster.values() if v), default=0.0)
        t_other = max((statistics.fmean(v) for v in other.values() if v), default=0.0)
        t_client = max(
            (statistics.fmean(cluster[c]) + statistics.fmean(other[c]) for c in cluster if cluster[c]), default=0.0
        )
        t_agg = statistics.fmean(aggregate.values()) if aggregate else 0.0
        return {
            "train": t_train,
            "cluster": t_cluster,
            "other": t_other,
            "client_exchange": t_client,
            "aggregate": t_agg,
            "total": t_train + t_client + t_agg,
        }

    def measured_eq5_s(self, epochs: int) -> float:
        """Eq. 5's terms summed over this run's own rounds (only the rounds that exchanged pay the
        exchange), scaled to ``epochs`` epochs: a check of Eq. 5 against a run with that Agg_fr."""
        by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in self.records:
            by_round[int(r["round"])].append(r)
        total = 0.0
        for rows in by_round.values():
            total += max(float(r.get("train_s", 0.0)) for r in rows)
            if any(r.get("exchanged") for r in rows):
                total += max(
                    sum(
                        float(v)
                        for k, v in r.items()
                        if k.endswith("_s") and k not in _NOT_EXCHANGE and isinstance(v, (int, float))
                    )
                    for r in rows
                )
                total += max(float(r.get("aggregate_s", 0.0)) for r in rows)
        return total * epochs / max(len(by_round), 1)


def _mean(values: Iterable[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else None


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every folder at or under ``paths`` holding a ``summary.json`` (a finished run)."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise ReportError(f"{p} does not exist")
        if (p / "summary.json").is_file():
            found.append(p)
            continue
        found.extend(sorted(s.parent for s in p.rglob("summary.json")))
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ReportError(
            "no finished run found under "
            + ", ".join(str(p) for p in paths)
            + " (a run folder holds summary.json; run 'trustformer run' or 'trustformer reproduce' first)"
        )
    return unique


def load_run(path: str | Path) -> RunResult:
    path = Path(path)
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path / 'summary.json'} cannot be read: {exc}") from None
    records: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        for n, line in enumerate(metrics.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ReportError(f"{metrics} line {n} is not JSON: {exc}") from None
            (events if "event" in item else records).append(item)
    return RunResult(path=path, summary=summary, records=records, events=events)


def load_runs(paths: Iterable[str | Path]) -> list[RunResult]:
    """Load every finished run under ``paths``, sorted in the paper's order; labels made unique."""
    runs = sorted((load_run(p) for p in find_run_dirs(paths)), key=RunResult.sort_key)
    seen: dict[str, list[RunResult]] = defaultdict(list)
    for run in runs:
        seen[run.label].append(run)
    for same in seen.values():
        if len(same) > 1:
            for run in same:
                run.label_suffix = f" [{run.path.name}]"
    return runs
