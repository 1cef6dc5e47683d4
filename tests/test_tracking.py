"""The tracker mirrors metrics.jsonl / summary.json to TensorBoard and MLflow: read back what it wrote."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import jsonl

from trustformer.recording.tracking import TRACKERS, Tracker, final_scalars, flatten, mlflow_uri

CONFIG = {
    "seed": 0,
    "strategy": "trustformer",
    "optim": {"lr": 0.003, "betas": [0.9, 0.98]},
    "data": {"partition": "iid", "client_sizes": []},
    "long": "x" * 600,
}


def line(rnd: int, client: int) -> dict:
    return {
        "round": rnd,
        "client": client,
        "node": 7 + client,
        "test_loss": 5.0 - rnd - client / 10,
        "train_loss": 6.0 - rnd,
        "bytes_up": 1000 * rnd + client,
        "bytes_down": 2000,
        "lr": 0.001 * rnd,
        "steps": 8 + client,
        "train_tokens": 100 * (client + 1),
        "tokens_per_s": 250.0,
        "train_s": 0.5 + client,
        "aggregate_s": 0.25,
        "exchanged": True,
    }


SUMMARY = {
    "rounds": 2,
    "client_ids": [0, 1],
    "test_loss": [2.5, 3.5],
    "bleu": [10.0, 20.0],
    "chrf": [30.0, 40.0],
    "meteor": [None, None],
    "round_time_s": [1.0, 2.0],
    "bytes": {"up_total": 4002, "down_total": 8000},
    "time_s": {"train": 4.0, "total": 9.5},
    "throughput": {"train_tokens_per_s": 300.0},
    "config": CONFIG,
}

EVENT = {"event": "dropped", "round": 2, "client": 1, "reason": "train failed: node unavailable"}


def run_tracker(tmp_path, kind: str) -> None:
    tracker = Tracker(tmp_path, (kind,), CONFIG, run_name="test-run")
    for rnd in (1, 2):
        for client in (0, 1):
            tracker.record(line(rnd, client))
        if rnd == 2:
            tracker.record(EVENT)  # event lines go through record too
        tracker.round_done(rnd)
    tracker.summary(SUMMARY)
    tracker.close()
    tracker.close()  # idempotent


def expected_scalars() -> dict[str, list[tuple[int, float]]]:
    out = {
        "client_1/test_loss": [(1, 3.9), (2, 2.9)],
        "client_0/test_loss": [(1, 4.0), (2, 3.0)],
        "client_1/bytes_up": [(1, 1001.0), (2, 2001.0)],
        "client_0/lr": [(1, 0.001), (2, 0.002)],
        "client_1/time/train_s": [(1, 1.5), (2, 1.5)],
        "client_0/time/aggregate_s": [(1, 0.25), (2, 0.25)],
        "client_1/tokens_per_s": [(1, 250.0), (2, 250.0)],  # a rate, not a phase time
        "mean/test_loss": [(1, 3.95), (2, 2.95)],
        "mean/time/train_s": [(1, 1.0), (2, 1.0)],
        "mean/steps": [(1, 8.5), (2, 8.5)],
        "events/dropped": [(2, 1.0)],
        "final/client_1/test_loss": [(2, 3.5)],
        "final/mean/bleu": [(2, 15.0)],
        "final/mean/chrf": [(2, 35.0)],
        "final/bytes/up_total": [(2, 4002.0)],
        "final/time_s/total": [(2, 9.5)],
    }
    return out


NOT_WRITTEN = (
    "client_0/round",
    "client_0/client",
    "client_0/node",
    "client_0/exchanged",
    "client_0/time/tokens_per_s",
    "final/mean/meteor",
    "final/client_0/client_ids",
    "final/mean/round_time_s",
)


def test_tensorboard_scalars_text_and_hparams_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run_tracker(tmp_path, "tensorboard")
    logdir = tmp_path / "tensorboard"
    assert [p for p in logdir.iterdir() if p.is_dir()] == []  # hparams in the same log dir, no subfolder
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag, points in expected_scalars().items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), tag
    assert not tags & set(NOT_WRITTEN)

    (text,) = acc.Tensors("events/text_summary")
    assert text.step == 2 and json.loads(text.tensor_proto.string_val[0].decode()) == EVENT

    content = acc.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(0.003)
    assert start.hparams["strategy"].string_value == "trustformer"
    assert start.hparams["optim.betas"].string_value == "[0.9, 0.98]"
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metric_tags = {m.name.tag for m in experiment.metric_infos}
    assert {"final/mean/test_loss", "final/mean/bleu"} <= metric_tags
    assert not any(t.startswith("final/client_") for t in metric_tags)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # MLflow's SQLAlchemy models on SQLAlchemy 2.1
def test_mlflow_metrics_params_and_events_read_back(tmp_path):
    from mlflow.tracking import MlflowClient

    run_tracker(tmp_path, "mlflow")
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=mlflow_uri(tmp_path))
    experiment = client.get_experiment_by_name("trustformer")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "test-run" and run.info.status == "FINISHED"
    for tag, points in expected_scalars().items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-9), tag
    assert not set(run.data.metrics) & set(NOT_WRITTEN)

    params = run.data.params
    assert params["optim.lr"] == "0.003" and params["strategy"] == "trustformer" and params["seed"] == "0"
    assert params["optim.betas"] == "[0.9, 0.98]" and params["data.client_sizes"] == "[]"
    assert len(params["long"]) == 500

    events = client.download_artifacts(run.info.run_id, "events.jsonl", str(tmp_path))
    assert jsonl(events) == [EVENT]


def test_close_writes_the_means_of_open_rounds(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracker(tmp_path, ["tensorboard", "tensorboard"], {}, run_name="r") as tracker:
        tracker.record(line(1, 0))
        tracker.record(line(1, 1))  # no round_done: close() writes the means
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("mean/bytes_up")] == [(1, 1000.5)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_mlflow_run_of_a_failed_training_is_marked_failed(tmp_path):
    from mlflow.tracking import MlflowClient

    with pytest.raises(RuntimeError), Tracker(tmp_path, ("mlflow",), {"seed": 1}, run_name="r") as tracker:
        tracker.record(line(1, 0))
        raise RuntimeError("training failed")
    client = MlflowClient(tracking_uri=mlflow_uri(tmp_path))
    (run,) = client.search_runs([client.get_experiment_by_name("trustformer").experiment_id])
    assert run.info.status == "FAILED" and run.data.params == {"seed": "1"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "mean/test_loss")] == [(1, 4.0)]


def test_unknown_kind_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="'wandb'.*tensorboard, mlflow"):
        Tracker(tmp_path, ("tensorboard", "wandb"), {}, run_name="r")
    assert TRACKERS == ("tensorboard", "mlflow")
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize(
    "kind, module, package",
    [("tensorboard", "torch.utils.tensorboard", "tensorboard"), ("mlflow", "mlflow", "mlflow-skinny")],
)
def test_missing_package_says_what_to_install(tmp_path, monkeypatch, kind, module, package):
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)  # the import fails as if not installed
    with pytest.raises(ImportError, match=f"pip install {package}"):
        Tracker(tmp_path, (kind,), {}, run_name="r")


def test_flatten_and_final_scalars():
    assert flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": {}, "f": None}) == {"a.b": 1, "a.c.d": [1], "e": {}, "f": None}
    final = final_scalars(SUMMARY)
    assert final["final/client_0/test_loss"] == 2.5 and final["final/mean/test_loss"] == 3.0
    assert "final/mean/meteor" not in final and "final/mean/round_time_s" not in final
    assert final["final/throughput/train_tokens_per_s"] == 300.0
