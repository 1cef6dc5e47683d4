"""What a run writes: ``metrics.jsonl`` (one line per round and client) and ``summary.json``.

Phase times are seconds; in the summary, ``time_s`` holds totals over all clients and rounds for
each client phase, server phases (``aggregate``) counted once per round, and ``total``, the run's
wall-clock time. Bytes are lengths of the serialized message
contents actually exchanged.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

PHASE_SUFFIX = "_s"
RATE_SUFFIX = "_per_s"  # a rate (tokens_per_s, examples_per_s), not seconds of a phase


class RunRecorder:
    """Appends per-(round, client) records to ``metrics.jsonl`` and builds ``summary.json``."""

    def __init__(self, out_dir: str | Path, *, total_rounds: int, tracker: Any = None) -> None:
        self.tracker = tracker  # tracking.Tracker: mirrors every line to TensorBoard / MLflow (runtime.log)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.metrics_path.write_text("", encoding="utf-8")
        self.records: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.total_rounds = total_rounds
        self.started = time.perf_counter()
        self._round_started = self.started

    def record(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
        if self.tracker is not None:
            self.tracker.record(record)

    def event(self, **event: Any) -> None:
        """A noteworthy event (a dropped client, a rejected payload), also kept in metrics.jsonl."""
        event.setdefault("event", "note")
        self.events.append(event)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")
        if self.tracker is not None:
            self.tracker.event(event)

    def round_done(self, round_: int) -> None:
        """Log one progress line for the round: per-client test loss, round time, ETA."""
        now = time.perf_counter()
        elapsed = now - self.started
        losses = [
            f"c{r['client']} {r['test_loss']:.3f}"
            for r in self.records
            if r["round"] == round_ and r.get("test_loss") is not None
        ]
        eta = elapsed / round_ * (self.total_rounds - round_)
        log.info(
            "round %d/%d done in %.1f s · test loss %s · elapsed %s · ETA %s",
            round_,
            self.total_rounds,
            now - self._round_started,
            ", ".join(losses),
            fmt_s(elapsed),
            fmt_s(eta),
        )
        self._round_started = now
        if self.tracker is not None:
            self.tracker.round_done(round_)

    def summary(self, **fields: Any) -> dict[str, Any]:
        """Aggregate the records into the summary dict (and write ``summary.json``)."""
        records = self.records
        phase_totals: dict[str, float] = defaultdict(float)
        for r in records:
            for key, value in r.items():
                if key.endswith(PHASE_SUFFIX) and not key.endswith(RATE_SUFFIX) and isinstance(value, (int, float)):
                    phase_totals[key[: -len(PHASE_SUFFIX)]] += float(value)
        # server phases are copied onto every client's line of their round; count them once
        for key, value in fields.get("server_time_s", {}).items():
            phase_totals[key[: -len(PHASE_SUFFIX)] if key.endswith(PHASE_SUFFIX) else key] = float(value)
        time_s = {k: round(v, 4) for k, v in sorted(phase_totals.items())}
        time_s["total"] = round(time.perf_counter() - self.started, 4)
        time_s.setdefault("train", 0.0)
        summary: dict[str, Any] = {
            "bytes": {
                "up_per_client_per_round": _mean(r["bytes_up"] for r in records),
                "down_per_client_per_round": _mean(r["bytes_down"] for r in records),
                "up_total": sum(r["bytes_up"] for r in records),
                "down_total": sum(r["bytes_down"] for r in records),
            },
            "time_s": time_s,
            "throughput": _throughput(records),
            "events": self.events,
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),  # runtime.threads, or the cores free at the start
            },
        }
        for key, value in fields.items():
            if key == "bytes":
                summary["bytes"].update(value)
            else:
                summary[key] = value
        path = self.out_dir / "summary.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        if self.tracker is not None:
            self.tracker.summary(summary)
            self.tracker.close()
        return summary


def _throughput(records: list[dict[str, Any]]) -> dict[str, float]:
    """Training throughput over the run: target tokens (labels, padding excluded) per second of local
    training, summed over clients (``train_tokens`` / ``train_s`` of every line); for the image tasks
    also ``train_examples`` (images) and ``train_examples_per_s``."""
    tokens = sum(int(r.get("train_tokens", 0)) for r in records)
    seconds = sum(float(r.get("train_s", 0.0)) for r in records if "train_tokens" in r)
    out = {"train_tokens": tokens, "train_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0}
    if any("examples" in r for r in records):
        examples = sum(int(r.get("examples", 0)) for r in records)
        seconds = sum(float(r.get("train_s", 0.0)) for r in records if "examples" in r)
        out.update(train_examples=examples, train_examples_per_s=round(examples / seconds, 1) if seconds > 0 else 0.0)
    return out


def _mean(values) -> float:
    values = list(values)
    return float(statistics.fmean(values)) if values else 0.0


def fmt_s(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
