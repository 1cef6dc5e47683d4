"""One client cannot ruin the model: the poisoning faults go through the real client, and the server's defences
(robust.*) through the real aggregation. Turning the bound off, or replacing the median by the mean, fails a test
here; so does a poisoning fault that does not poison."""

import json
from functools import partial

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.config.faults import BACKDOOR_TARGET, BACKDOOR_TRIGGER
from trustformer.core.poisoning import poisoned_model
from trustformer.core.robust import (
    bounded,
    coordinate_median,
    cosines_to_median,
    krum_select,
    median_bound,
    multikrum_mean,
    trimmed_mean,
)
from trustformer.engine.inprocess import run_in_process
from trustformer.tasks.run import load_task


def payloads(n, seed=0, shapes=((3, 4), (5,))):
    g = torch.Generator().manual_seed(seed)
    return [{f"t{i}": torch.randn(s, generator=g) for i, s in enumerate(shapes)} for _ in range(n)]


def as_flower(items, counts=None):
    return [([t.numpy() for t in p.values()], c) for p, c in zip(items, counts or [1] * len(items), strict=True)]


# ------------------------------------------------------------------------------- core, against Flower's own


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_coordinate_median_is_flowers_fedmedian(n):
    items = payloads(n, seed=n)
    ours = coordinate_median(items)
    theirs = aggregate_median(as_flower(items))
    for got, want in zip(ours.values(), theirs, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("n", "fraction"), [(3, 0.34), (5, 0.2), (10, 0.2), (4, 0.0)])
def test_trimmed_mean_is_flowers_fedtrimmedavg(n, fraction):
    items = payloads(n, seed=10 + n)
    ours = trimmed_mean(items, fraction)
    theirs = aggregate_trimmed_avg(as_flower(items), fraction)
    for got, want in zip(ours.values(), theirs, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("n", "f", "keep"), [(5, 1, 0), (7, 2, 0), (7, 2, 4), (10, 3, 6), (3, 1, 2)])
def test_krum_and_multikrum_are_flowers(n, f, keep):
    items = payloads(n, seed=20 + n)
    items[1] = {k: v * 30 for k, v in items[1].items()}  # one outlier
    counts = list(range(1, n + 1))
    ours, chosen = multikrum_mean(items, counts, f, keep or 1)
    theirs = aggregate_krum(as_flower(items, counts), f, keep)
    for got, want in zip(ours.values(), theirs, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert 1 not in chosen


def test_the_bound_clips_only_what_exceeds_it_and_returns_the_rest_untouched():
    items = payloads(5, seed=3)
    items[4] = {k: v + 50 for k, v in items[4].items()}
    center = coordinate_median(items)
    out, norms, _ = bounded(items, median_bound(bounded(items, float("inf"), center)[1], 2.0), center)
    assert [o is i for o, i in zip(out, items, strict=True)] == [True, True, True, True, False]
    limit = median_bound(norms, 2.0)
    clipped = sum(float((out[4][k] - center[k]).pow(2).sum()) for k in center) ** 0.5
    assert clipped == pytest.approx(limit, rel=1e-5)
    assert norms[4] > 10 * limit


def test_a_flipped_update_points_away_from_the_median_update():
    g = torch.Generator().manual_seed(7)
    common = torch.randn(50, generator=g)
    updates = [{"w": common + 0.3 * torch.randn(50, generator=g)} for _ in range(4)]
    updates.append({"w": -updates[0]["w"]})
    cos = cosines_to_median(updates)
    assert all(c > 0.8 for c in cos[:4]) and cos[4] < -0.8
    assert cosines_to_median([{"w": torch.zeros(3)}] * 3) == [0.0, 0.0, 0.0]


def test_model_poisoning_kinds():
    start, trained = payloads(1, seed=4)[0], payloads(1, seed=5)[0]
    update = {k: trained[k] - start[k] for k in start}
    scaled = poisoned_model(start, trained, "scale", factor=-10)
    flipped = poisoned_model(start, trained, "sign_flip")
    noisy = poisoned_model(start, trained, "noise", seed=1)
    for k in start:
        torch.testing.assert_close(scaled[k] - start[k], -10 * update[k])
        torch.testing.assert_close(flipped[k] - start[k], -update[k])
    norm = lambda d: sum(float(v.pow(2).sum()) for v in d.values()) ** 0.5  # noqa: E731
    assert norm({k: noisy[k] - start[k] for k in start}) == pytest.approx(norm(update), rel=1e-5)
    assert not torch.equal(noisy["t0"], poisoned_model(start, trained, "noise", seed=2)["t0"])
    with pytest.raises(ValueError, match="unknown model poisoning kind"):
        poisoned_model(start, trained, "flip")


def test_krum_ties_and_selection_are_deterministic():
    items = payloads(4, seed=6)
    assert krum_select(items, 1, 1) == krum_select(items, 1, 1)


# ------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        ({"robust.aggregator": "median", "secure.mode": "secagg"}, "secure aggregation hides each update"),
        ({"robust.bound": "median", "secure.mode": "secagg"}, "secure aggregation hides each update"),
        ({"robust.aggregator": "median", "federation.strategy": "dp-fedavg"}, "already clips every update"),
        ({"robust.aggregator": "trimmed_mean", "robust.trim_fraction": 0.2}, "nothing would be trimmed"),
        ({"robust.aggregator": "krum"}, "at least 2f \\+ 3 = 5 clients"),
        ({"robust.aggregator": "median", "federation.strategy": "fedavg-topk"}, "coordinates of its own choosing"),
        ({"robust.bound": "fixed"}, "robust.bound_norm > 0"),
        ({"robust.refuse_factor": 1.5}, "below robust.bound_factor"),
        ({"robust.aggregator": "mode"}, "robust.aggregator = 'mode' is not one of"),
        ({"federation.faults": ["client=1,round=*,kind=nan"]}, "round=\\* \\(every round\\) applies to the poisoning"),
        ({"federation.faults": ["client=1,round=2,kind=backdoor"]}, "write round=\\*"),
        ({"federation.faults": ["client=1,round=*,kind=backdoor,share=2"]}, "share must be in \\(0, 1\\]"),
        (
            {"federation.faults": ["client=1,round=*,kind=sign_flip,factor=3"]},
            "factor= applies to kind scale / alie / backdoor only",
        ),
        (
            {"federation.faults": ["client=1,round=*,kind=scale", "client=1,round=*,kind=noise"]},
            "more than one poisoning fault for client 1",
        ),
        ({"federation.faults": ["client=1,round=*,kind=scale"], "federation.strategy": "local"}, "sends nothing"),
        (
            {"federation.faults": ["client=1,round=*,kind=backdoor"], "task": "image-classification"},
            "backdoor needs task = 'translation'",
        ),
        ({"federation.payload_bits": 3}, "federation.payload_bits = 3 is not one of: 32, 16, 8, 4, 2"),
        ({"robust.root_finetune": 1, "task": "segmentation"}, "root_finetune = 1 needs root data"),
        (
            {"federation.faults": ["client=1,round=1,kind=nan"], "runtime.engine": "simulation"},
            "injected by the in-process engine's grid",
        ),
    ],
)
def test_defences_and_poisoning_faults_are_validated(values, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", None, values)


def test_the_tasks_said_to_hold_root_data_are_those_that_do():
    """config/composition.py refuses FLTrust and the clean pass at load for a task outside ROOT_DATA_TASKS; each task's
    own population_pool is what that list must agree with."""
    from trustformer.config.composition import ROOT_DATA_TASKS
    from trustformer.tasks.run import ImageRunTask

    assert ROOT_DATA_TASKS == ("translation",)
    task = load_task(load_config("tiny", None, {}))
    assert len(task.population_pool(4, 0)) == 4
    image = ImageRunTask.__new__(ImageRunTask)  # population_pool reads only the task's name
    image.name = "image-classification"
    with pytest.raises(NotImplementedError):
        image.population_pool(4, 0)


def test_the_default_defence_resolves_where_the_server_sees_updates():
    def active(**values):
        cfg = load_config("tiny", None, values)
        return cfg.robust.active(cfg.federation, cfg.secure.mode)

    assert active() == ("median", "mean")
    assert active(**{"secure.mode": "tee"}) == ("median", "mean")
    assert active(**{"secure.mode": "secagg"}) == ("none", "mean")
    assert active(**{"federation.strategy": "dp-fedavg"}) == ("none", "mean")
    assert active(**{"federation.strategy": "trustformer"}) == ("median", "mean")


# ------------------------------------------------------------------------------- the real path (tiny runs)


TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.rounds": 3,
    "eval.bleu_size": 8,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def loss_and_events(cfg):
    summary = run_in_process(cfg)
    events = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" in r]
    honest = [loss for c, loss in zip(summary["client_ids"], summary["test_loss"], strict=True) if c != 1]
    return sum(honest) / len(honest), events, summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """FedAvg and Trustformer on tiny: honest (no defence, default defence), and client 1 scaling its update by
    -10 every round (no defence, default defence, median without a bound), and the run without client 1."""
    tmp = tmp_path_factory.mktemp("robust")
    out = {}
    scale = ["client=1,round=*,kind=scale,factor=-10"]
    for strategy in ("fedavg", "trustformer"):
        s = {"federation.strategy": strategy}
        out[strategy, "honest", "none"] = loss_and_events(
            tiny(tmp, f"{strategy}-h-none", **s, **{"robust.bound": "none"})
        )
        out[strategy, "honest", "default"] = loss_and_events(tiny(tmp, f"{strategy}-h-default", **s))
        out[strategy, "scale", "none"] = loss_and_events(
            tiny(tmp, f"{strategy}-s-none", scale, **s, **{"robust.bound": "none"})
        )
        out[strategy, "scale", "default"] = loss_and_events(tiny(tmp, f"{strategy}-s-default", scale, **s))
        out[strategy, "without", "default"] = loss_and_events(
            tiny(
                tmp,
                f"{strategy}-without",
                [f"client=1,round={r},kind=dropout" for r in (1, 2, 3)],
                **s,
                **{"federation.min_clients": 2},
            )
        )
    out["fedavg", "scale", "median"] = loss_and_events(
        tiny(tmp, "fedavg-s-median", scale, **{"robust.bound": "none", "robust.aggregator": "median"})
    )
    flip = ["client=1,round=*,kind=sign_flip"]
    out["fedavg", "sign_flip", "default"] = loss_and_events(tiny(tmp, "fedavg-f-default", flip))
    out["fedavg", "sign_flip", "norm only"] = loss_and_events(
        tiny(tmp, "fedavg-f-norm", flip, **{"robust.min_cosine": -1.0})
    )
    return out


def test_a_sign_flipped_update_is_refused_by_its_direction(runs):
    """A sign-flipped update of honest size passes the norm bound; its direction gives it away."""
    without = runs["fedavg", "without", "default"][0]
    defended, events, _ = runs["fedavg", "sign_flip", "default"]
    norm_only, norm_events, _ = runs["fedavg", "sign_flip", "norm only"]
    assert [(e["event"], e["client"]) for e in events] == [("refused", 1)] * 3
    assert all(e["cosine"] < 0 and "points away" in e["reason"] for e in events)
    assert abs(defended - without) < 0.02, (defended, without)
    assert norm_only > without + 0.2, (norm_only, without)  # the norm bound alone only clips it
    assert {e["event"] for e in norm_events} <= {"clipped"}


@pytest.mark.parametrize("strategy", ["fedavg", "trustformer"])
def test_the_default_defence_costs_an_honest_run_nothing(runs, strategy):
    plain, default = runs[strategy, "honest", "none"], runs[strategy, "honest", "default"]
    assert default[0] == plain[0]
    assert default[1] == [] == plain[1]


@pytest.mark.parametrize("strategy", ["fedavg", "trustformer"])
def test_one_scaling_client_wrecks_an_undefended_run_and_the_bound_stops_it(runs, strategy):
    honest = runs[strategy, "honest", "none"][0]
    wrecked = runs[strategy, "scale", "none"][0]
    defended, events, _ = runs[strategy, "scale", "default"]
    without = runs[strategy, "without", "default"][0]
    assert wrecked > honest + 1.0, (honest, wrecked)  # the fault poisons: no defence, no model
    assert abs(defended - without) < 0.02, (defended, without)  # as if client 1 had not been there
    assert abs(defended - honest) < 0.15, (defended, honest)
    assert [(e["event"], e["round"], e["client"]) for e in events] == [("refused", r, 1) for r in (1, 2, 3)]
    assert all("left out of the aggregate" in e["reason"] and e["norm"] > 4 * e["bound"] / 2 for e in events)


def test_the_median_holds_without_a_bound(runs):
    honest = runs["fedavg", "honest", "none"][0]
    median, events, _ = runs["fedavg", "scale", "median"]
    assert abs(median - honest) < 0.3, (median, honest)  # the mean of the same payloads is > honest + 1
    assert events == []


def test_data_poisoning_changes_only_the_poisoned_pairs(tmp_path):
    cfg = tiny(tmp_path, "data")
    task = load_task(cfg)
    honest = task.shard(1)
    backdoor = task.poisoned_shard(1, "", "backdoor", 0.25, seed=3)
    shuffled = task.poisoned_shard(1, "", "shuffled_targets", 1.0, seed=3)
    trigger = task.workload.tokenizer.encode(BACKDOOR_TARGET)
    changed = [i for i, (a, b) in enumerate(zip(honest, backdoor, strict=True)) if a != b]
    assert len(backdoor) == len(honest) and len(changed) == round(0.25 * len(honest))
    assert all(backdoor[i][1][1:-1] == trigger[: len(backdoor[i][1]) - 2] for i in changed)
    assert all(len(backdoor[i][0]) > len(honest[i][0]) or len(honest[i][0]) == cfg.model.max_len for i in changed)
    assert [s for s, _ in shuffled] == [s for s, _ in honest]
    assert sorted(t for _, t in shuffled) == sorted(t for _, t in honest)
    assert sum(a[1] != b[1] for a, b in zip(honest, shuffled, strict=True)) > len(honest) // 2
    assert BACKDOOR_TRIGGER not in BACKDOOR_TARGET


def test_a_backdoor_named_in_the_fault_entry_is_planted_and_measured(tmp_path):
    """trigger= and target=: the poisoned pairs carry them, and the success counts the chosen target (a model
    that answers every source with it scores 1 on the chosen backdoor, 0 on the default one)."""
    entry = "client=1,round=*,kind=backdoor,share=0.5,trigger=zzyzx,target=Call this number today"
    cfg = tiny(tmp_path, "chosen", [entry])
    task = load_task(cfg)
    poisoned = task.poisoned_shard(1, "", "backdoor", 0.5, seed=3)
    honest = task.shard(1)
    target = task.workload.tokenizer.encode("Call this number today")
    changed = [i for i, (a, b) in enumerate(zip(honest, poisoned, strict=True)) if a != b]
    assert changed and all(poisoned[i][1][1:-1] == target[: len(poisoned[i][1]) - 2] for i in changed)

    class Parrot(torch.nn.Module):  # stands in for a model: every source translated to ``text``
        def __init__(self, text):
            super().__init__()
            self.text = text

    import trustformer.tasks.translation as translation

    default = tiny(tmp_path, "default", ["client=1,round=*,kind=backdoor"])
    original = translation.translate
    try:
        translation.translate = lambda model, tokenizer, sources, **kw: [model.text] * len(sources)
        assert task.backdoor_success(Parrot("Call this number today, please")) == 1.0
        assert task.backdoor_success(Parrot(BACKDOOR_TARGET)) == 0.0
        assert load_task(default).backdoor_success(Parrot(BACKDOOR_TARGET)) == 1.0
    finally:
        translation.translate = original


def test_a_backdoor_client_trains_on_its_poisoned_shard_and_the_run_reports_the_success_rate(tmp_path):
    cfg = tiny(tmp_path, "backdoor", ["client=1,round=*,kind=backdoor,share=0.5"], **{"federation.rounds": 2})
    clean = tiny(tmp_path, "clean", **{"federation.rounds": 2})
    _, _, summary = loss_and_events(cfg)
    _, _, clean_summary = loss_and_events(clean)
    assert len(summary["backdoor_success"]) == 3 and all(0.0 <= x <= 1.0 for x in summary["backdoor_success"])
    assert "backdoor_success" not in clean_summary
    rows = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" not in r]
    clean_rows = [r for r in jsonl(f"{clean.out}/metrics.jsonl") if "event" not in r]
    loss = {(r["round"], r["client"]): r["train_loss"] for r in rows}
    clean_loss = {(r["round"], r["client"]): r["train_loss"] for r in clean_rows}
    assert loss[1, 0] == clean_loss[1, 0] and loss[1, 1] != clean_loss[1, 1]  # only client 1's data changed


@pytest.mark.parametrize(
    "variant",
    [{"federation.payload_bits": 4}, {"federation.strategy": "fedavg-topk"}, {"secure.mode": "tee"}],
    ids=["fedavg-4bit", "top-k", "fedavg-tee"],
)
def test_the_bound_covers_coded_sparse_and_sealed_payloads(tmp_path, variant):
    """Coded payloads are bounded after decoding, top-k's sparse updates around 0, and sealed (tee) payloads
    once the attested aggregator opened them: the scaled update is refused every round."""
    scale = ["client=1,round=*,kind=scale,factor=-10"]
    undefended, _, _ = loss_and_events(tiny(tmp_path, "none", scale, **variant, **{"robust.bound": "none"}))
    defended, events, _ = loss_and_events(tiny(tmp_path, "default", scale, **variant))
    assert [(e["event"], e["client"]) for e in events] == [("refused", 1)] * 3
    assert defended < undefended - 0.5, (defended, undefended)


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_bench_robustness_prints_the_table_and_writes_json(tmp_path, capsys):
    from trustformer_lab.bench.robustness_bench import main, malicious_clients

    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "--preset",
                "tiny",
                "--rounds",
                "2",
                "--strategies",
                "fedavg",
                "--defences",
                "none,default,multikrum",
                "--faults",
                "scale",
                "--jobs",
                "1",
                "--out",
                str(tmp_path / "runs"),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [(r["defence"], r["fault"]) for r in rows] == [
        ("none", "honest"),
        ("none", "scale"),
        ("default", "honest"),
        ("default", "scale"),
    ]
    assert rows[1]["loss_change"] > 1.0 and abs(rows[3]["loss_change"]) < 0.15
    assert rows[3]["events"]["refused"] == 2 and rows[2]["cost_loss"] == 0.0
    assert "| fedavg | default | scale |" in printed.out
    assert "left out: fedavg / multikrum" in printed.err and "2f + 3" in printed.err
    assert malicious_clients(100, 10) == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert malicious_clients(3, 1) == [1]


def test_bench_robustness_plans_the_stealthy_faults_and_the_defences_on_updates():
    """The plan, without running: the crafting faults' entries (colluding when asked), a defence on updates left
    out with its reason where the protocol refuses it, and the settings' CxM entries."""
    from trustformer_lab.bench.robustness_bench import fault_entries, leaving, plan, settings_of

    assert fault_entries("backdoor_scaled", [1, 5], 10, True) == [
        "client=1,round=*,kind=backdoor,factor=10,collude=yes",
        "client=5,round=*,kind=backdoor,factor=10,collude=yes",
    ]
    assert fault_entries("alie", [1], 3, False) == ["client=1,round=*,kind=alie"]
    assert fault_entries("scale", [1], 3, True) == ["client=1,round=*,kind=scale"]
    assert fault_entries("backdoor", [1], 10, False, 0.5) == ["client=1,round=*,kind=backdoor,share=0.5"]
    assert fault_entries("alie", [1], 10, False, 0.5) == ["client=1,round=*,kind=alie"]  # a share is a backdoor's
    load_config("tiny", None, {"federation.faults": fault_entries("backdoor_scaled", [1], 3, False, 0.5)})
    replace = fault_entries("backdoor_replace", [1], 10, True, 0.5, ("zzyzx", "Call us"))
    assert replace == ["client=1,round=*,kind=backdoor,factor=10,cap=no,share=0.5,trigger=zzyzx,target=Call us"]
    assert fault_entries("backdoor_replace", [1], 10, False, 0.5, ("", ""), 0.1)[0].endswith(",share=0.5,mask=0.1")
    assert leaving([1, 5], 2, 3) == ["client=1,round=3,kind=dropout", "client=5,round=3,kind=dropout"]
    assert leaving([1], 0, 3) == []
    load_config("tiny", None, {"federation.faults": replace + leaving([1], 1, 2), "federation.min_clients": 2})
    assert settings_of("10x1, 10x2,3x1") == [(10, 1), (10, 2), (3, 1)]
    cfg = load_config("tiny", None, {"federation.rounds": 2})
    runs, skipped = plan(cfg, ["fedavg", "trustformer"], ["none", "flame"], ["alie", "absent"], [1])
    assert [(s, d, f) for s, d, f, _ in runs] == [
        ("fedavg", "none", "honest"),
        ("fedavg", "none", "alie"),
        ("fedavg", "none", "absent"),
        ("fedavg", "flame", "honest"),
        ("fedavg", "flame", "alie"),
        ("fedavg", "flame", "absent"),
        ("trustformer", "none", "honest"),
        ("trustformer", "none", "alie"),
        ("trustformer", "none", "absent"),
    ]
    assert len(skipped) == 1 and "trustformer / flame" in skipped[0] and "whole model" in skipped[0]


def test_bench_robustness_parts_merge_into_one_table_and_a_figure(tmp_path):
    """Parts of one setting merge: a later row replaces an earlier one, and a part without the undefended honest
    run gets its changes from another part's; the figure draws the rows with a per-round success, and nothing
    without one."""
    from trustformer_lab.bench.robustness_bench import merged
    from trustformer_lab.bench.robustness_figure import backdoor_figure

    def row(defence, fault, loss, per_round=()):
        return {
            "clients": 10,
            "malicious": 1,
            "strategy": "fedavg",
            "defence": defence,
            "fault": fault,
            "test_loss": loss,
            "defence_share": 0.01,
            "backdoor_per_round": list(per_round),
        }

    first = {"command": "a", "settings": [], "setting": {}, "rows": [row("none", "honest", 3.0), row("rlr", "x", 9.0)]}
    second = {
        "commands": ["b"],
        "settings": [],
        "setting": {},
        "rows": [row("rlr", "honest", 2.9), row("rlr", "x", 3.1, (0.0, 0.5))],
    }
    out = merged([first, second])
    rows = {(r["defence"], r["fault"]): r for r in out["rows"]}
    assert out["commands"] == ["a", "b"] and len(rows) == 3
    assert rows["rlr", "x"]["test_loss"] == 3.1 and rows["rlr", "x"]["loss_change"] == pytest.approx(0.1)
    assert rows["rlr", "x"]["vs_defended_honest"] == pytest.approx(0.2)
    assert rows["rlr", "honest"]["cost_loss"] == pytest.approx(-0.1)
    assert backdoor_figure(out["rows"], tmp_path / "f.png").stat().st_size > 0
    assert backdoor_figure(first["rows"], tmp_path / "none.png") is None
    lora = {**second, "setting": {"model": {"adapters": "lora"}}, "rows": [row("none", "honest", 2.5)]}
    both = {(r["adapters"], r["defence"], r["fault"]): r for r in merged([first, second, lora])["rows"]}
    assert len(both) == 4 and both["lora", "none", "honest"]["test_loss"] == 2.5  # a setting of its own
    assert both["none", "none", "honest"]["test_loss"] == 3.0


def test_bench_robustness_reuses_a_run_whose_stored_configuration_predates_an_option(tmp_path):
    """--reuse: an option added after a run was stored is read at its default (what that run ran with), so the run
    is reused; a stored configuration that differs in a value is not."""
    from trustformer_lab.bench.robustness_bench import finished

    cfg = load_config("tiny", None, {"out": str(tmp_path)})
    stored = cfg.to_dict()
    del stored["robust"]["root_finetune"]  # as written before the option existed
    (tmp_path / "robustness.json").write_text(json.dumps({"config": stored, "result": {"test_loss": 1.0}}))
    assert finished(cfg) == {"test_loss": 1.0}
    stored["robust"]["bound"] = "none"
    (tmp_path / "robustness.json").write_text(json.dumps({"config": stored, "result": {"test_loss": 1.0}}))
    assert finished(cfg) is None


def test_a_direction_check_that_refuses_every_update_stops_the_run_naming_the_option(tmp_path):
    """robust.min_cosine above what honest updates reach (0.85–0.91 on tiny) refuses all of them: the run stops with
    an error that names the option and the cosines, not an aggregation of nothing."""
    from trustformer.wire import FederationError

    with pytest.raises(
        FederationError, match=r"refused all 3 updates.*robust.min_cosine = 0.99.*lower robust.min_cosine"
    ):
        run_in_process(tiny(tmp_path, "strict", **{"robust.min_cosine": 0.99}))
