"""The same apps on Flower's Simulation Engine (Ray): the tiny preset gives the in-process engine's numbers."""

import json
from functools import partial

import pytest
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError
from trustformer.engine import run
from trustformer.engine.simulation import backend_config

TINY = {  # this module's tiny run (helpers.tiny_config)
    "eval.diagnostics": True,  # fedavg_distance, unclipped norms, the measured secagg error
    "runtime.threads": 1,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "federation.strategy": "trustformer",
}
tiny = partial(tiny_config, defaults=TINY)


def lines(cfg):
    return sorted(
        (r for r in map(json.loads, open(f"{cfg.out}/metrics.jsonl", encoding="utf-8")) if "event" not in r),
        key=lambda r: (r["round"], r["client"]),
    )


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_the_simulation_engine_gives_the_in_process_numbers(tmp_path):
    inproc = tiny(tmp_path, "inprocess")
    sim = tiny(tmp_path, "simulation", **{"runtime.engine": "simulation", "runtime.ray_cpus": 2})
    a, b = run(inproc), run(sim)
    assert b["test_loss"] == a["test_loss"] and b["bleu"] == a["bleu"]
    for x, y in zip(lines(inproc), lines(sim), strict=True):
        assert (x["round"], x["client"], x["test_loss"], x["bytes_down"]) == (
            y["round"],
            y["client"],
            y["test_loss"],
            y["bytes_down"],
        )
        assert "fedavg_distance" in x and "fedavg_distance" not in y  # a diagnostic of one process only
    assert (tmp_path / "simulation" / "client-state").is_dir()  # clients keep their state on disk
    assert b["models"] and (tmp_path / "simulation" / b["models"]["0"] / "model.safetensors").is_file()


def test_simulation_settings_are_checked_at_load(tmp_path):
    with pytest.raises(ConfigError, match="trust anchors"):
        tiny(tmp_path, "x", **{"runtime.engine": "simulation", "secure.mode": "tee"})
    with pytest.raises(ConfigError, match="runtime.ray_cpus applies to a local Ray only"):
        tiny(tmp_path, "x", **{"runtime.engine": "simulation", "runtime.ray_address": "auto", "runtime.ray_cpus": 2})
    cfg = tiny(
        tmp_path,
        "x",
        **{
            "runtime.engine": "simulation",
            "runtime.client_cpus": 0.5,
            "runtime.client_gpus": 0.25,
            "runtime.ray_address": "10.0.0.1:6379",
        },
    )
    assert backend_config(cfg) == {
        "client_resources": {"num_cpus": 0.5, "num_gpus": 0.25},
        "init_args": {"address": "10.0.0.1:6379"},
    }


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_secure_aggregation_on_the_simulation_engine_gives_the_in_process_numbers(tmp_path):
    values = {"federation.strategy": "fedavg", "secure.mode": "secagg"}
    a = run(tiny(tmp_path, "inprocess", **values))
    b = run(tiny(tmp_path, "simulation", **values, **{"runtime.engine": "simulation", "runtime.ray_cpus": 2}))
    assert b["test_loss"] == a["test_loss"] and b["secure"]["overhead"]["bytes"] == a["secure"]["overhead"]["bytes"]
    # the measured error of the masked sum needs every client's plain payload in one process, as fedavg_distance
    assert a["secure"]["secagg"]["measured_max_error"] is not None
    assert b["secure"]["secagg"]["measured_max_error"] is None


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_a_run_interrupted_in_process_resumes_on_the_simulation_engine(tmp_path):
    from helpers import Crash, crash_at

    from trustformer.engine.inprocess import run_in_process
    from trustformer.runtime.checkpoint import read_checkpoint, resume_config

    values = {"federation.rounds": 3, "runtime.store": "disk"}
    full = run(tiny(tmp_path, "full", **values))
    stopped = tiny(tmp_path, "stopped", **values)
    with pytest.raises(Crash):
        run_in_process(stopped, client_app=crash_at("train.apply", 2, 1))
    assert read_checkpoint(stopped.out).round == 1
    resumed = run(resume_config(stopped.out, {"runtime.engine": "simulation", "runtime.ray_cpus": 2}))
    assert resumed["test_loss"] == full["test_loss"] and resumed["resumed_after_rounds"] == [1]


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_a_poisoning_client_on_the_simulation_engine_is_refused_as_in_process(tmp_path):
    """Poisoning faults are the client's own doing, so they run on the Simulation Engine too, and the server's
    bound refuses the scaled update there exactly as in process."""
    faults = {"federation.faults": ["client=1,round=*,kind=scale,factor=-10"], "federation.strategy": "fedavg"}
    inproc = tiny(tmp_path, "inprocess", **faults)
    sim = tiny(tmp_path, "simulation", **faults, **{"runtime.engine": "simulation", "runtime.ray_cpus": 2})
    a, b = run(inproc), run(sim)
    assert b["test_loss"] == a["test_loss"]
    events = [r for r in jsonl(f"{sim.out}/metrics.jsonl") if "event" in r]
    assert [(e["event"], e["round"], e["client"]) for e in events] == [("refused", r, 1) for r in (1, 2)]
