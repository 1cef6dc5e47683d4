"""Mirror a run's ``metrics.jsonl`` and ``summary.json`` to TensorBoard and/or MLflow.

``metrics.jsonl`` stays the source of truth; a :class:`Tracker` only copies what the run writes into
the run folder, next to it:

- ``tensorboard``: event files under ``<out_dir>/tensorboard/``
  (``tensorboard --logdir <out_dir>/tensorboard``);
- ``mlflow``: a SQLite tracking store ``<out_dir>/mlruns/mlflow.db`` with artifacts under
  ``<out_dir>/mlruns/artifacts/``, experiment ``trustformer``, one run named ``run_name``
  (``mlflow ui --backend-store-uri sqlite:///<out_dir>/mlruns/mlflow.db``, which needs the full
  ``mlflow`` package). MLflow 3's ``./mlruns`` file store refuses to open unless
  ``MLFLOW_ALLOW_FILE_STORE=true``, SQLite needs nothing more than SQLAlchemy and alembic (which flwr
  installs anyway). MLflow's usage telemetry is switched off unless ``MLFLOW_DISABLE_TELEMETRY`` is
  already set.

Tags written (the same names in both tools; the step is the round):

- ``client_{c}/{key}`` for every numeric field of a client's line (``test_loss``, ``train_loss``,
  ``bytes_up``, ``bytes_down``, ``lr``, ``steps``, ``train_tokens``, ``tokens_per_s``, ...), with phase
  times (keys ending in ``_s`` but not ``_per_s``) as ``client_{c}/time/{key}``, e.g.
  ``client_1/time/train_s``. Booleans, strings, ``round``, ``client`` and ``node`` are left out;
- ``mean/{key}`` (``mean/test_loss``, ``mean/time/train_s``): the mean over the clients of the round,
  written by :meth:`Tracker.round_done`;
- ``events/{name}``: the running count of events of that name (``events/dropped``), and in
  TensorBoard each event line as JSON text under ``events``; in MLflow all of them as the artifact
  ``events.jsonl`` at :meth:`Tracker.close`;
- at step = the last round, from the summary: ``final/client_{c}/{key}`` and ``final/mean/{key}`` for
  each per-client list (``test_loss``, ``bleu``, ``chrf``, ``accuracy``, ...; ``None`` entries are
  skipped), and ``final/bytes/{key}``, ``final/time_s/{key}``, ``final/throughput/{key}``;
- hyper-parameters: the configuration flattened to dotted keys (``optim.lr``): TensorBoard's hparams
  plugin (written into the same log dir, with the ``final/`` scalars other than per-client ones as
  its metrics) at :meth:`Tracker.summary`; MLflow params (values as strings, cut to 500 characters,
  keys to 250) as soon as the tracker opens.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "mlflow")
NOT_METRICS = frozenset({"round", "client", "node"})
PARAM_VALUE_MAX = 500  # older MLflow servers refuse longer param values (3.x takes 6000)
KEY_MAX = 250  # MLflow's limit on metric and param names
BATCH = 100  # MLflow's log_batch takes at most 100 params (1000 metrics)


class Tracker:
    """Logs a run's metrics lines, events and summary to the tools in ``kinds`` (see the module doc)."""

    # the optional tools' objects (imported lazily, untyped here): SummaryWriter, MLflow client, run id, Metric
    _writer: Any
    _mlflow: Any
    _run_id: Any
    _Metric: Any

    def __init__(self, out_dir: str | Path, kinds: Sequence[str], config: dict, run_name: str) -> None:
        if isinstance(kinds, str):
            kinds = (kinds,)
        self.kinds = tuple(dict.fromkeys(kinds))
        unknown = [k for k in self.kinds if k not in TRACKERS]
        if unknown:
            raise ValueError(
                f"unknown tracker(s) {', '.join(map(repr, unknown))}: valid ones are {', '.join(TRACKERS)}"
            )
        self.out_dir = Path(out_dir)
        self.hparams = flatten(config)
        self.last_round = 0
        self._rounds: dict[int, dict[str, list[float]]] = {}  # round -> tag -> client values
        self._event_counts: Counter[str] = Counter()
        self._events: list[str] = []
        self._pending: list[Any] = []  # MLflow metrics not yet sent
        self._status = "KILLED"  # until summary() is called
        self._closed = False
        self._writer = self._mlflow = self._run_id = self._Metric = None
        if "tensorboard" in self.kinds:
            self._writer = _summary_writer(self.out_dir / "tensorboard")
        if "mlflow" in self.kinds:
            self._mlflow, self._run_id, self._Metric = _mlflow_run(self.out_dir, run_name, self.hparams)

    # ------------------------------------------------------------------------------------------ lines

    def record(self, line: dict) -> None:
        """One ``metrics.jsonl`` line: ``client_{c}/...`` scalars at step = round (event lines go to
        :meth:`event`)."""
        if "event" in line:
            self.event(line)
            return
        rnd = int(line["round"])
        self.last_round = max(self.last_round, rnd)
        per_tag = self._rounds.setdefault(rnd, defaultdict(list))
        for key, value in sorted(line.items()):
            if key in NOT_METRICS or not _is_number(value):
                continue
            tag = f"time/{key}" if key.endswith("_s") and not key.endswith("_per_s") else key
            self._scalar(f"client_{line['client']}/{tag}", value, rnd)
            per_tag[tag].append(float(value))

    def round_done(self, rnd: int) -> None:
        """All lines of round ``rnd`` are in: write the ``mean/...`` scalars and flush."""
        for tag, values in sorted(self._rounds.pop(rnd, {}).items()):
            self._scalar(f"mean/{tag}", statistics.fmean(values), rnd)
        self._flush()

    def event(self, line: dict) -> None:
        """An event line (``{"event": "dropped", "round": 2, ...}``): ``events/{name}`` count and text."""
        rnd = int(line.get("round", self.last_round))
        name = _clean(str(line["event"]))
        self._event_counts[name] += 1
        self._scalar(f"events/{name}", self._event_counts[name], rnd)
        text = json.dumps(line, sort_keys=True, ensure_ascii=False, default=str)
        self._events.append(text)
        if self._writer is not None:
            self._writer.add_text("events", text, rnd)

    # ---------------------------------------------------------------------------------------- summary

    def summary(self, summary: dict) -> None:
        """The run's ``summary.json``: ``final/...`` scalars at step = last round, and the hparams."""
        step = int(summary.get("rounds") or self.last_round)
        final = final_scalars(summary)
        for tag, value in final.items():
            self._scalar(tag, value, step)
        if self._writer is not None:
            from torch.utils.tensorboard.summary import hparams

            metrics = {k: v for k, v in final.items() if not k.startswith("final/client_")}
            values = {
                k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
                for k, v in self.hparams.items()
                if v is not None
            }
            for proto in hparams(values, metrics):  # experiment, session start, session end
                self._writer.file_writer.add_summary(proto, step)
        self._status = "FINISHED"
        self._flush()

    def close(self) -> None:
        """Write the rounds still open, flush and close; the MLflow run ends FINISHED if
        :meth:`summary` was called, KILLED otherwise."""
        if self._closed:
            return
        for rnd in sorted(self._rounds):
            self.round_done(rnd)
        self._flush()
        if self._writer is not None:
            self._writer.close()
        if self._mlflow is not None:
            if self._events:
                self._mlflow.log_text(self._run_id, "\n".join(self._events) + "\n", "events.jsonl")
            self._mlflow.set_terminated(self._run_id, status=self._status)
        self._closed = True

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._status = "FAILED"
        self.close()

    # ------------------------------------------------------------------------------------------ utils

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._writer.add_scalar(tag, float(value), step)
        if self._mlflow is not None:
            self._pending.append(self._Metric(_clean(tag), float(value), int(time.time() * 1000), step))

    def _flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        if self._mlflow is not None:
            pending, self._pending = self._pending, []
            for i in range(0, len(pending), 1000):
                self._mlflow.log_batch(self._run_id, metrics=pending[i : i + 1000])


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-3}}`` -> ``{"optim.lr": 1e-3}`` (non-empty dicts only; lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def final_scalars(summary: dict) -> dict[str, float]:
    """The summary's scores as ``final/...`` tags: each per-client list of numbers (one entry per
    ``client_ids``, ``None`` allowed; lists of ``*_s`` keys are per round and left out) per client and
    their mean, and the numbers of the ``bytes``, ``time_s`` and ``throughput`` dicts."""
    ids = list(summary.get("client_ids") or range(len(summary.get("test_loss") or [])))
    out: dict[str, float] = {}
    for key, values in sorted(summary.items()):
        if key == "client_ids" or key.endswith("_s") or not isinstance(values, list) or len(values) != len(ids):
            continue
        if not all(v is None or _is_number(v) for v in values):
            continue
        numbers = [float(v) for v in values if v is not None and not math.isnan(v)]
        if not numbers:
            continue
        for c, v in zip(ids, values, strict=True):
            if v is not None:
                out[f"final/client_{c}/{key}"] = float(v)
        out[f"final/mean/{key}"] = statistics.fmean(numbers)
    for group in ("bytes", "time_s", "throughput"):
        for key, value in sorted((summary.get(group) or {}).items()):
            if _is_number(value):
                out[f"final/{group}/{key}"] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _clean(name: str) -> str:
    """A tag MLflow accepts: alphanumerics, ``_ - . / space``, at most 250 characters."""
    return re.sub(r"[^\w./ -]", "_", name)[:KEY_MAX]


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= PARAM_VALUE_MAX else text[: PARAM_VALUE_MAX - 1] + "…"


def _summary_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError("tracking with kinds=('tensorboard',) needs TensorBoard: pip install tensorboard") from exc
    return SummaryWriter(log_dir=str(log_dir))


def _mlflow_run(out_dir: Path, run_name: str, params: dict[str, Any]):
    """A new run named ``run_name`` in experiment ``trustformer`` of the store :func:`mlflow_uri`, with
    ``params`` logged: the client, the run id and the ``Metric`` class."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ImportError(
            "tracking with kinds=('mlflow',) needs MLflow: pip install mlflow-skinny "
            "(or pip install 'trustformer[tracking]')"
        ) from exc
    root = Path(out_dir) / "mlruns"
    root.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=mlflow_uri(out_dir))
    experiment = client.get_experiment_by_name("trustformer")
    if experiment is None:
        artifacts = (root / "artifacts").resolve().as_uri()
        experiment_id = client.create_experiment("trustformer", artifact_location=artifacts)
    else:
        experiment_id = experiment.experiment_id
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    items = [Param(_clean(k), _param_value(v)) for k, v in params.items()]
    for i in range(0, len(items), BATCH):
        client.log_batch(run_id, params=items[i : i + BATCH])
    return client, run_id, Metric


def mlflow_uri(out_dir: str | Path) -> str:
    """The tracking URI of a run folder's MLflow store: ``sqlite:///<out_dir>/mlruns/mlflow.db``."""
    return "sqlite:///" + str((Path(out_dir) / "mlruns" / "mlflow.db").resolve())
