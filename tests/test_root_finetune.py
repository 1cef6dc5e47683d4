"""The clean fine-tuning pass on root data (``robust.root_finetune``, docs/robustness.md): the round's model is the
aggregate trained by the server's root training (a planted no-op pass fails that test), each round records the
pass and its time, the pass's optimizer state is checkpointed (a resume without it differs), and the
configurations it cannot apply to are refused when they load."""

from dataclasses import replace
from functools import partial

import pytest
import torch
from helpers import Crash, begin_server, crash_at, forget_process, jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core.aggregation import weighted_mean
from trustformer.core.shared import derive_seed
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import make_protocol
from trustformer.protocols.wrappers.robust import RobustAggregation
from trustformer.runtime import node as node_runtime
from trustformer.runtime.checkpoint import read_checkpoint, resume_config
from trustformer.runtime.root_training import root_training
from trustformer.tasks.run import initial_tensors

EPOCHS, ROOT = 2, 60  # a small root set keeps each pass under a second on `tiny`
EXAMPLES = [60, 60, 120]

# ------------------------------------------------------------------------------- the pass itself


def config(**overrides):
    values = {"out": "", "robust.root_finetune": EPOCHS, "robust.root_size": ROOT, "robust.bound": "none"}
    return load_config("tiny", None, {**values, **overrides})


def client_models(initial, rnd):
    """Three whole-model payloads near ``initial``, seeded by the round."""
    g = torch.Generator().manual_seed(rnd)
    return [{n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in initial.items()} for _ in EXAMPLES]


@pytest.fixture(scope="module")
def reference():
    """Two rounds' payloads, and what the pass must make of their means: the RootTraining callable called directly
    (the task's recipe for ``EPOCHS`` epochs on the root data), its optimizer state carried from round 1 to 2."""
    cfg = config()
    node_runtime.process_setup(cfg)  # runtime.threads, as the server's process has it
    initial = initial_tensors(cfg)
    train = root_training(replace(cfg, train=replace(cfg.train, local_epochs=EPOCHS)))
    rounds, state = [], None
    for rnd in (1, 2):
        payloads = client_models(initial, rnd)
        mean = weighted_mean(payloads, [float(n) for n in EXAMPLES])
        tuned, state = train(mean, state, derive_seed(cfg.seed, "root-finetune", rnd))
        rounds.append((payloads, mean, tuned))
    return initial, rounds


def server_rounds(cfg, initial, rounds):
    """What the server's protocol (make_protocol: every wrapper) returns for each round's payloads."""
    protocol = begin_server(make_protocol(cfg), initial)
    out = []
    for rnd, (payloads, _mean, _tuned) in enumerate(rounds, start=1):
        result = protocol.aggregate(rnd, payloads, EXAMPLES)
        aggregate, phases = result.tensors, result.phases
        protocol.server().exchange_done(rnd, aggregate)
        out.append(
            (
                aggregate,
                phases,
                result.events,
                protocol.catching_up().catch_up(rnd - 1),
                protocol.catching_up().catch_up(rnd),
            )
        )
    return out


def is_the_fine_tuned_aggregate(results, rounds):
    for rnd, ((aggregate, phases, events, _held, _current), (_payloads, mean, tuned)) in enumerate(
        zip(results, rounds, strict=True), 1
    ):
        assert set(aggregate) == set(tuned)
        assert all(torch.equal(aggregate[n], tuned[n]) for n in tuned), f"round {rnd}: not the fine-tuned aggregate"
        assert not all(torch.equal(aggregate[n], mean[n]) for n in mean), f"round {rnd}: the plain mean"
        assert [e["event"] for e in events] == ["root_finetuned"] and "index" not in events[0]
        moved = sum(float((tuned[n].double() - mean[n].double()).pow(2).sum()) for n in mean) ** 0.5
        assert events[0]["update_norm"] == pytest.approx(moved) and events[0]["epochs"] == EPOCHS
        assert phases["root_finetune_s"] > 0


@pytest.mark.parametrize("variant", ["pass", "no-op"])
def test_the_rounds_model_is_the_aggregate_trained_on_the_root_data(monkeypatch, reference, variant):
    initial, rounds = reference
    if variant == "no-op":  # the planted bug: the pass returns the aggregate it was given
        monkeypatch.setattr(RobustAggregation, "_fine_tuned", lambda self, aggregate, report: aggregate)
    results = server_rounds(config(), initial, rounds)
    if variant == "pass":
        is_the_fine_tuned_aggregate(results, rounds)
    else:
        with pytest.raises(AssertionError):
            is_the_fine_tuned_aggregate(results, rounds)


def test_a_client_left_out_catches_up_to_the_fine_tuned_model(reference):
    initial, rounds = reference
    results = server_rounds(config(**{"federation.clients_per_round": 2}), initial, rounds)
    for (aggregate, _phases, _events, held, current), _round in zip(results, rounds, strict=True):
        assert held is not None and current is None  # a client of the round before catches up, one of this round not
        assert all(torch.equal(held[n], aggregate[n]) for n in aggregate)


# ------------------------------------------------------------------------------- the real path (tiny runs)


TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.store": "disk",
    "federation.rounds": 2,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "robust.root_finetune": 1,
    "robust.root_size": ROOT,
}
tiny = partial(tiny_config, defaults=TINY)


def events_of(out):
    return [r for r in jsonl(f"{out}/metrics.jsonl") if "event" in r]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    cfg = tiny(tmp_path_factory.mktemp("finetune") / "plain")
    return cfg, run_in_process(cfg)


def test_each_round_records_its_pass_and_its_time(plain):
    cfg, summary = plain
    passes = [e for e in events_of(cfg.out) if e["event"] == "root_finetuned"]
    assert [e["round"] for e in passes] == [1, 2] and all("client" not in e for e in passes)
    assert all(e["update_norm"] > 0 and e["epochs"] == 1 for e in passes)
    assert summary["server_time_s"]["root_finetune_s"] > 0
    assert len(set(summary["test_loss"])) == 1  # every client holds the fine-tuned model


def test_under_secure_aggregation_the_server_fine_tunes_the_unmasked_mean(tmp_path, plain):
    _cfg, summary = plain
    secagg = run_in_process(tiny(tmp_path / "secagg", **{"secure.mode": "secagg"}))
    assert [e["round"] for e in events_of(tmp_path / "secagg") if e["event"] == "root_finetuned"] == [1, 2]
    # the same model up to secure aggregation's fixed-point rounding (secure.secagg_scale_bits)
    assert secagg["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-5)


def killed_in_round_2(cfg):
    """Run ``cfg`` until a client is sent round 2's ``train``, forget the process, resume; the resumed summary."""

    with pytest.raises(Crash):
        run_in_process(cfg, client_app=crash_at("train", 2))
    forget_process()  # what a restarted process no longer holds
    assert read_checkpoint(cfg.out).round == 1
    return run_in_process(resume_config(cfg.out))


@pytest.mark.parametrize("variant", ["checkpointed", "left out"])
def test_the_passs_optimizer_state_is_needed_to_resume_exactly(tmp_path, monkeypatch, plain, variant):
    _cfg, summary = plain
    if variant == "left out":  # the planted bug: the pass's optimizer state is not saved (declared scratch)
        cls, attr = RobustAggregation, "_finetune_optimizer"
        monkeypatch.setattr(cls, "state_attrs", tuple(a for a in cls.state_attrs if a != attr))
        monkeypatch.setattr(cls, "scratch_attrs", (*cls.scratch_attrs, attr))
    resumed = killed_in_round_2(tiny(tmp_path / "stopped"))
    assert (resumed["test_loss"] == summary["test_loss"]) == (variant == "checkpointed")


# ------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("strategy", ["trustformer", "fedavg-topk", "dp-fedavg", "local"])
def test_it_is_refused_where_payloads_are_not_whole_models(strategy):
    with pytest.raises(ConfigError, match=r"robust.root_finetune = 1 does not apply to .* each payload is a whole"):
        load_config("tiny", None, {"robust.root_finetune": 1, "federation.strategy": strategy})


@pytest.mark.parametrize("value", [-1, 101])
def test_absurd_values_are_refused(value):
    with pytest.raises(ConfigError, match=rf"robust.root_finetune = {value} must be in \[0, 100\]"):
        load_config("tiny", None, {"robust.root_finetune": value})


def wrappers(cfg):
    protocol, found = make_protocol(cfg), []
    while protocol is not None:
        found.append(protocol)
        protocol = getattr(protocol, "inner", None)
    return [p for p in found if isinstance(p, RobustAggregation)]


def test_it_puts_the_defence_wrapper_in_force_alone():
    # under secure aggregation the bound is off (auto) and the rule is the mean: no defence, no wrapper
    values = {"out": "", "secure.mode": "secagg"}
    assert not wrappers(load_config("tiny", None, values))
    (robust,) = wrappers(load_config("tiny", None, {**values, "robust.root_finetune": 1}))
    assert (robust.bound, robust.aggregator) == ("none", "mean")


def test_the_image_tasks_lack_root_data():
    """Refused when the configuration loads (config/composition.py: ROOT_DATA_TASKS)."""
    with pytest.raises(ConfigError, match="robust.root_finetune = 1 needs root data.*set robust.root_finetune = 0"):
        load_config("tiny", None, {"task": "image-classification", "robust.root_finetune": 1})
