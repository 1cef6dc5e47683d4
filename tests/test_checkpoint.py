"""Client state snapshots, the server's round checkpoint and resuming a stopped run (in one process)."""

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from helpers import Crash, crash_at, jsonl

from trustformer.app import CONFIG_KEY, FederationError, client_app, server_app
from trustformer.cli import main
from trustformer.config import ConfigError, build_config, load_config
from trustformer.engine.inprocess import InProcessGrid, node_configs, run_in_process
from trustformer.protocols import make_protocol
from trustformer.runtime.checkpoint import CheckpointError, read_checkpoint, read_server_state, resume_config, run_key
from trustformer.runtime.store import ROUND_END, TRAINED, ClientState, DiskStore, MemoryStore


def _state(value: float, rounds: int) -> ClientState:
    return ClientState(
        model={"w": torch.full((2, 2), value)},
        optimizer={"state": {}, "param_groups": []},
        protocol={"labels": torch.tensor([rounds])},
        rounds_done=rounds,
    )


@pytest.mark.parametrize("make_store", [MemoryStore, DiskStore], ids=["memory", "disk"])
def test_snapshots_load_the_latest_point_at_or_before_and_keep_two_rounds(tmp_path, make_store):
    store = make_store(tmp_path) if make_store is DiskStore else make_store()
    assert store.load("c0", upto=(0, ROUND_END)) is None  # round 1 starts from the initial model
    store.save("c0", _state(1.0, 1), at=(1, TRAINED))
    store.save("c0", _state(1.5, 1), at=(1, ROUND_END))
    store.save("c0", _state(2.0, 2), at=(2, TRAINED))
    assert store.load("c0", upto=(1, ROUND_END)).model["w"][0, 0] == 1.5  # train of round 2
    assert store.load("c0", upto=(2, TRAINED)).model["w"][0, 0] == 2.0  # train.apply of round 2
    assert store.load("c0", upto=(1, TRAINED)).model["w"][0, 0] == 1.0
    store.save("c0", _state(2.5, 2), at=(2, ROUND_END))
    store.save("c0", _state(3.0, 3), at=(3, ROUND_END))
    assert store.points("c0") == [(2, TRAINED), (2, ROUND_END), (3, ROUND_END)]  # rounds 2 and 3 only
    assert store.load("c0", upto=(1, ROUND_END)) is None
    # a re-sent round 2 (a resumed server) replaces what came after it
    store.save("c0", _state(2.25, 2), at=(2, TRAINED))
    assert store.points("c0") == [(2, TRAINED)]
    assert store.load("c0", upto=(3, ROUND_END)).model["w"][0, 0] == 2.25
    assert store.load("c1", upto=(3, ROUND_END)) is None
    if make_store is DiskStore:
        assert sorted(p.name for p in (tmp_path / "c0").iterdir()) == ["r00002-trained.pt"]  # no temp files


def test_run_key_ignores_operational_settings_only(tmp_path):
    cfg = load_config("tiny", None, {"out": str(tmp_path / "a")})
    same = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path / "a" / ".." / "a"),
            "runtime.resume": True,
            "federation.round_timeout_s": 30.0,
            "runtime.threads": 2,
        },
    )
    assert run_key(cfg) == run_key(same)
    assert run_key(cfg) != run_key(load_config("tiny", None, {"out": str(tmp_path / "b")}))
    assert run_key(cfg) != run_key(load_config("tiny", None, {"out": str(tmp_path / "a"), "seed": 1}))


_crash_at = crash_at


def _lines(path):
    return jsonl(path)


def _results(line):
    """A metrics line without its timings (wall-clock measurements differ between runs)."""
    return {k: v for k, v in line.items() if not k.endswith("_s")}


@pytest.mark.parametrize(
    "strategy,extra",
    [
        ("trustformer", {}),  # client-side protocol state (memberships, centroids) in the snapshots
        (
            "dp-fedavg",
            {
                "privacy.noise_multiplier": 0.5,
                "privacy.sampling_rate": 0.7,  # server-side accountant
                "privacy.noise_source": "seeded-not-private",  # the same noise and sampling again
                "privacy.on_exceed": "continue",
            },
        ),
        # the server's defence keeps the model the next round starts from (its direction check): a sign-flipping
        # client is refused in every round of the resumed run as in the uninterrupted one
        ("fedavg", {"federation.faults": ["client=1,round=*,kind=sign_flip"]}),
    ],
)
def test_resumed_run_ends_as_the_uninterrupted_one(tmp_path, strategy, extra):
    values = {
        "federation.strategy": strategy,
        "federation.rounds": 3,
        "runtime.store": "disk",
        "runtime.progress": False,
        "eval.meteor": False,
        "eval.bertscore": False,
        **extra,
    }
    full = run_in_process(load_config("tiny", None, {**values, "out": str(tmp_path / "full")}))
    stopped = load_config("tiny", None, {**values, "out": str(tmp_path / "stopped")})
    # the run dies in round 2, after clients 0 (and 2) already trained it: they get round 2 again
    with pytest.raises(Crash):
        run_in_process(stopped, client_app=_crash_at("train.apply", 2, 1))
    checkpoint = read_checkpoint(stopped.out)
    assert checkpoint.round == 1 and len(checkpoint.round_s) == 1
    state = read_server_state(stopped.out, checkpoint)
    assert state["protocol"]["class"] == (
        "RobustAggregation" if strategy == "fedavg" else type(make_protocol(stopped)).__name__
    )
    assert sorted(p.name for p in (tmp_path / "stopped").glob("server-state-*")) == ["server-state-r00001.pt"]
    resumed = run_in_process(resume_config(stopped.out))
    assert resumed["test_loss"] == full["test_loss"]
    assert resumed["resumed_after_rounds"] == [1] and len(resumed["round_time_s"]) == 3
    if strategy.startswith("dp-"):
        assert resumed["privacy"]["epsilon_per_round"] == full["privacy"]["epsilon_per_round"]
    # metrics.jsonl continues: round 1 as first written, rounds 2-3 once, and a note that it resumed
    lines = _lines(tmp_path / "stopped" / "metrics.jsonl")
    events = [_results(x) for x in lines if "event" in x and x["event"] != "resumed"]
    assert [x["event"] for x in lines if x.get("event") == "resumed"] == ["resumed"]
    full_events = [_results(x) for x in _lines(tmp_path / "full" / "metrics.jsonl") if "event" in x]
    assert events == full_events  # round 1's as first written, then rounds 2-3's once
    assert [e["event"] for e in full_events] == (["refused"] * 3 if "federation.faults" in extra else [])
    assert [_results(x) for x in lines if "event" not in x] == [
        _results(x) for x in _lines(tmp_path / "full" / "metrics.jsonl") if "event" not in x
    ]
    assert read_checkpoint(stopped.out).round == 3


def test_resume_refuses_another_configuration_and_a_missing_checkpoint(tmp_path):
    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path / "run"),
            "federation.rounds": 1,
            "runtime.store": "disk",
            "runtime.progress": False,
            "eval.meteor": False,
            "eval.bertscore": False,
        },
    )
    run_in_process(cfg)
    with pytest.raises(ConfigError, match="federation.rounds"):
        resume_config(cfg.out, {"federation.rounds": 2})
    values = cfg.to_dict()
    values["seed"], values["runtime"]["resume"] = 3, True
    changed = build_config(values)
    with pytest.raises(ConfigError, match="cannot resume: seed = 3 differs"):
        run_in_process(changed)
    with pytest.raises(CheckpointError, match="does not exist"):
        resume_config(tmp_path / "never-ran")


def test_the_default_run_killed_at_any_round_resumes_exactly_through_the_cli(tmp_path, capsys):
    """The default store (auto) keeps the clients' state where ``--resume`` finds it: killed in any round, after
    client 0 trained it and before client 1 did, the run continued with ``trustformer run --resume`` ends as the
    uninterrupted one."""
    values = {"federation.rounds": 3, "runtime.progress": False, "eval.meteor": False, "eval.bertscore": False}
    full = run_in_process(load_config("tiny", None, {**values, "out": str(tmp_path / "full")}))
    for killed_in in (1, 2, 3):
        stopped = load_config("tiny", None, {**values, "out": str(tmp_path / f"killed-in-{killed_in}")})
        assert stopped.runtime.store == "auto"
        with pytest.raises(Crash):
            run_in_process(stopped, client_app=_crash_at("train", killed_in, 1))
        assert read_checkpoint(stopped.out).round == killed_in - 1
        assert main(["run", "--resume", str(stopped.out), "--quiet"]) == 0, capsys.readouterr().err
        resumed = json.loads((Path(stopped.out) / "summary.json").read_text(encoding="utf-8"))
        assert resumed["test_loss"] == full["test_loss"], killed_in
        assert resumed["resumed_after_rounds"] == [killed_in - 1]


def test_a_resume_without_the_clients_state_is_refused_by_the_runtime(tmp_path, capsys):
    """Refused where resume happens (the in-process runtime), so no entry point resumes it silently: a run whose
    clients kept their state in memory, and a default run whose client state was removed."""
    values = {"federation.rounds": 2, "runtime.progress": False, "eval.meteor": False, "eval.bertscore": False}
    memory = load_config("tiny", None, {**values, "runtime.store": "memory", "out": str(tmp_path / "memory")})
    default = load_config("tiny", None, {**values, "out": str(tmp_path / "default")})
    for cfg in (memory, default):
        with pytest.raises(Crash):
            run_in_process(cfg, client_app=_crash_at("train", 2, 1))
    with pytest.raises(CheckpointError, match="the interrupted run the clients keep their state in memory"):
        run_in_process(resume_config(memory.out))  # the Python API, as the crash harness and scripts resume
    # an operational override cannot make it resumable: the state it needs was never written
    with pytest.raises(CheckpointError, match="runtime.store = memory"):
        run_in_process(resume_config(memory.out, {"runtime.store": "disk"}))
    with pytest.raises(CheckpointError, match="in this resume the clients keep their state in memory"):
        run_in_process(resume_config(default.out, {"runtime.store": "memory"}))
    assert main(["run", "--resume", str(memory.out)]) == 1
    err = capsys.readouterr().err
    assert "runtime.store = memory" in err and "--overwrite" in err and "Traceback" not in err
    import shutil

    client_1 = next((tmp_path / "default" / "client-state").glob("*/client-1"))
    shutil.rmtree(client_1)  # planted: one client's state lost
    with pytest.raises(CheckpointError, match="client 1 applied round 1's aggregate, but its state is not"):
        run_in_process(resume_config(default.out))
    assert main(["run", "--resume", str(default.out), "--rounds", "3"]) == 2
    assert "drop --rounds" in capsys.readouterr().err


def test_too_few_nodes_at_the_start_is_a_clear_error_not_a_hang(tmp_path):
    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path / "few"),
            "federation.node_wait_s": 1.0,
            "federation.min_clients": 3,
            "runtime.progress": False,
        },
    )
    grid = InProcessGrid(client_app, node_configs(cfg)[:2], {CONFIG_KEY: cfg.to_json()})  # 2 of the 3 clients
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={CONFIG_KEY: cfg.to_json()})
    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        with pytest.raises(FederationError, match=r"only 2 of 3 client node\(s\) connected within 1 s"):
            server_app(grid, context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous


def test_a_kill_between_the_state_file_and_the_manifest_resumes_from_the_last_complete_pair(tmp_path, monkeypatch):
    """The server dies after writing round 2's state file, before replacing the manifest: the run resumes from round
    1's manifest and state (never round 2's tensors with round 1's manifest) and ends as the uninterrupted run."""
    from trustformer.runtime import checkpoint as module

    values = {
        "federation.rounds": 3,
        "federation.payload_bits": 4,  # the coding layer's reference: state that changes every round
        "runtime.store": "disk",
        "runtime.progress": False,
        "eval.meteor": False,
        "eval.bertscore": False,
    }
    full = run_in_process(load_config("tiny", None, {**values, "out": str(tmp_path / "full")}))
    stopped = load_config("tiny", None, {**values, "out": str(tmp_path / "stopped")})
    write = module._write_atomically

    def killed_before_round_2s_manifest(path, data):
        if path.name == module.CHECKPOINT_FILE and (path.parent / "server-state-r00002.pt").exists():
            raise Crash()
        write(path, data)

    monkeypatch.setattr(module, "_write_atomically", killed_before_round_2s_manifest)
    with pytest.raises(Crash):
        run_in_process(stopped)
    monkeypatch.setattr(module, "_write_atomically", write)
    checkpoint = read_checkpoint(stopped.out)
    assert checkpoint.round == 1 and checkpoint.state_file == "server-state-r00001.pt"
    assert (tmp_path / "stopped" / "server-state-r00002.pt").exists()  # the orphan the manifest does not name
    resumed = run_in_process(resume_config(stopped.out))
    assert resumed["test_loss"] == full["test_loss"]
    assert sorted(p.name for p in (tmp_path / "stopped").glob("server-state-*")) == ["server-state-r00003.pt"]


def test_an_altered_or_missing_state_file_is_refused_with_a_clear_message(tmp_path):
    values = {"federation.rounds": 1, "runtime.store": "disk", "runtime.progress": False}
    values.update({"eval.meteor": False, "eval.bertscore": False, "out": str(tmp_path / "run")})
    cfg = load_config("tiny", None, values)
    run_in_process(cfg)
    (tmp_path / "run" / "summary.json").unlink()
    state = tmp_path / "run" / read_checkpoint(cfg.out).state_file
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte altered
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        run_in_process(resume_config(cfg.out))
    state.unlink()
    with pytest.raises(CheckpointError, match="names the server state server-state-r00001.pt, which cannot be read"):
        run_in_process(resume_config(cfg.out))


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"round": 2, "config": {"seed"', "is not valid JSON (truncated?)"),
        ("[]", "not a checkpoint of format 3"),
        ('{"format": 2, "round": 2}', "(format 2, written by another version of trustformer)"),
        ('{"format": 3, "round": 2}', "is incomplete (no config, lines)"),
    ],
)
def test_a_corrupt_checkpoint_names_the_file_and_what_to_do(tmp_path, capsys, text, problem):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.json").write_text(text, encoding="utf-8")
    assert main(["run", "--resume", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"trustformer: error: {run / 'checkpoint.json'} ") and problem in err, err
    assert "the run cannot be resumed from it; start it again with --overwrite, or " in err
    assert "Traceback" not in err and err.count("\n") == 1
    # a new run into that folder says why it cannot be resumed, and what to do
    assert main(["run", "--preset", "tiny", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cannot be resumed" in err and problem in err and "--overwrite" in err
