"""Membership inference by the server: the statistics against an obviously correct reference, and the attack
through the real round loop on translation and on an image task."""

import math
from functools import partial

import pytest
from helpers import tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.config import load_config
from trustformer_lab.attack.membership import auc, run_membership, summarize, tpr_at_fpr


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=30), st.lists(st.integers(-5, 5), min_size=1, max_size=30))
def test_auc_is_the_probability_a_member_outscores_a_non_member(members, non_members):
    pairs = [(m > n) + 0.5 * (m == n) for m in members for n in non_members]
    assert auc(members, non_members) == pytest.approx(sum(pairs) / len(pairs))


def test_tpr_at_a_false_positive_rate():
    non_members = list(range(100))  # scores 0..99
    members = [99.5, 98.5, 50, 10]
    assert tpr_at_fpr(members, non_members, 0.01) == 0.5  # threshold 98: one non-member (99) above it
    assert tpr_at_fpr(members, non_members, 0.0) == 0.25  # only the member above every non-member
    assert tpr_at_fpr(members, non_members, 0.5) == 0.75
    summary = summarize({0: ([1.0, 2.0], [0.0, 0.5]), 1: ([0.0], [1.0])}, seed=0)
    assert summary["auc"] == [1.0, 0.0] and summary["auc_mean"] == 0.5 and len(summary["auc_mean_ci95"]) == 2


TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "data.client_size": 30,
    "data.own_test_size": 30,
    "train.local_epochs": 8,
    "train.lr": 2e-2,
    "federation.rounds": 2,
}
tiny = partial(tiny_config, defaults=TINY)


@pytest.fixture(scope="module")
def overfit(tmp_path_factory):
    """Clients that memorise their 30 pairs: the true local models give their members away."""
    tmp = tmp_path_factory.mktemp("mia")
    return {s: run_membership(tiny(tmp, s, **{"federation.strategy": s}), candidates=30) for s in ("fedavg", "local")}


def test_the_true_local_model_gives_members_away_and_fedavgs_server_holds_it(overfit):
    fedavg = overfit["fedavg"]
    true_local = fedavg["true-local"]["calibrated-initial"]["auc_mean"]
    assert true_local > 0.75 and fedavg["true-local"]["calibrated-initial"]["candidates"] == [30, 30, 30]
    # FedAvg's server receives each trained model itself: its view is the true local model
    assert fedavg["server"]["calibrated-initial"]["auc_mean"] == pytest.approx(true_local)
    assert fedavg["advantage"]["auc_minus_half"] > 0.25


def test_a_server_that_receives_nothing_learns_nothing(overfit):
    local = overfit["local"]
    assert local["server_sees"] == "nothing"
    assert local["server"]["calibrated-initial"]["auc_mean"] == 0.5  # the public model scores every example alike
    assert local["true-local"]["calibrated-initial"]["auc_mean"] > 0.75


def test_translation_needs_held_out_pairs_of_the_clients_domains(tmp_path):
    from trustformer.tasks.translation_workload import DataError

    with pytest.raises(DataError, match="data.own_test_size"):
        run_membership(tiny(tmp_path, "x", **{"data.own_test_size": 0}), candidates=5)


def test_the_same_attack_runs_on_an_image_task(tmp_path):
    cfg = load_config(
        "tiny",
        None,
        {"task": "image-classification", "out": str(tmp_path / "img"), "runtime.progress": False, "runtime.threads": 1},
    )
    result = run_membership(cfg, candidates=40)
    server = result["server"]["loss"]
    assert len(server["auc"]) == 3 and all(0.0 <= a <= 1.0 for a in server["auc"])
    assert min(server["candidates"]) > 0 and not math.isnan(result["advantage"]["auc_minus_half"])


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    import json

    from trustformer.cli import main

    out = tmp_path / "mia.json"
    assert (
        main(
            [
                "attack",
                "membership",
                "--preset",
                "tiny",
                "--strategies",
                "fedavg",
                "--rounds",
                "1",
                "--set",
                "data.own_test_size=10",
                "--candidates",
                "10",
                "--out",
                str(tmp_path / "runs"),
                "--json",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "TPR@1%" in printed and "calibrated-global" in printed
    run = json.loads(out.read_text())["runs"][0]
    assert run["server"]["loss"]["candidates"] == [10, 10, 10] and run["advantage"]["score"] in (
        "loss",
        "calibrated-initial",
        "calibrated-global",
        "lira",
    )


def test_clients_that_send_identical_payloads_are_each_matched_to_what_the_server_received():
    """Two owners can send the same tensors (a round that moved nothing): each is still one received payload,
    so the attack scores every client, not the last one to send."""
    import torch

    from trustformer_lab.attack.run_observer import RunRecorder

    recorder = RunRecorder()
    same = {"w": torch.ones(2, 2)}
    other = {"w": torch.zeros(2, 2)}
    for client, payload in ((0, same), (1, {"w": same["w"].clone()}), (2, other)):
        recorder.client_trained(1, client, payload, 10)
        recorder.client_sent(1, client, payload)
    recorder.server_received([same, {"w": same["w"].clone()}, other], [10, 10, 10])
    assert sorted(recorder.exchanges[1].received) == [0, 1, 2]
