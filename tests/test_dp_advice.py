"""What an owner is told before a record-level DP run (tasks/dp_advice.py): the measured figures, from the file the
docs print, and only where they were measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trustformer.config import load_config
from trustformer.tasks.dp_advice import MEASURED_AT_EPSILON_8, SHARE_AT_6_OWNERS, dp_advice

ROOT = Path(__file__).resolve().parents[1]


def test_the_advice_quotes_the_measured_curve():
    curve = json.loads((ROOT / "docs" / "bench" / "dp-pays.json").read_text(encoding="utf-8"))["curve"]
    points = {p["records_per_owner"]: p for p in curve["dp ε=8 + fine-tuning"]["points"]}
    assert set(points) == set(MEASURED_AT_EPSILON_8)
    for records, (dp, fedavg) in MEASURED_AT_EPSILON_8.items():
        assert dp == pytest.approx(points[records]["gain_nats"], abs=1e-4)
        assert fedavg == pytest.approx(points[records]["fedavg_gain_nats"], abs=1e-4)


def test_the_advice_quotes_the_owners_axis():
    """The shares of FedAvg's gain at 6 owners, with the noise added once and at each owner, are the files' (both
    seeds, test and own data)."""
    label = {
        "distributed": "dp ε=8 distributed + fine-tuning @ 6 owners",
        "per_owner": "dp ε=8 + fine-tuning @ 6 owners",
    }
    for name in ("dp-pays-owners.json", "dp-pays-owners-seed2.json"):
        rows = json.loads((ROOT / "docs" / "bench" / name).read_text(encoding="utf-8"))["rows"]
        for noise, run in label.items():
            row = next(r for r in rows if r["run"] == run)
            (seed,) = row["seeds"]
            assert SHARE_AT_6_OWNERS[noise][seed] == pytest.approx((row["gain_loss"], row["gain_own_loss"]), abs=0.005)


@pytest.mark.parametrize(
    ("values", "told"),
    [
        ({"privacy.unit": "record", "data.client_size": 3000}, True),
        ({"privacy.unit": "record", "data.client_size": 0}, True),  # whole shards: this corpus's 4,584 at most
        ({"privacy.unit": "record", "data.client_size": 20000}, False),  # past what was measured: nothing to quote
        ({"privacy.unit": "client", "federation.strategy": "dp-fedavg", "data.client_size": 3000}, False),
        ({"data.client_size": 3000}, False),  # no DP
    ],
)
def test_the_advice_is_given_where_it_was_measured(tmp_path, values, told):
    advice = dp_advice(load_config("tiny", None, {"out": str(tmp_path), **values}))
    assert (advice is not None) == told
    if told:
        assert "0.01-0.02 nats" in advice and "train.init = 'public'" in advice
        assert (
            "6 owners of 1,500 records and the noise added once" in advice and "privacy.noise = 'distributed'" in advice
        )
        assert advice.endswith("gives most of what the federation would give.")


def test_a_run_with_local_noise_is_pointed_at_the_noise_added_once(tmp_path):
    local = {"out": str(tmp_path), "privacy.unit": "record", "data.client_size": 1500}
    once = {**local, "privacy.noise": "distributed", "secure.mode": "secagg"}
    assert "This run adds the noise at each owner" in dp_advice(load_config("tiny", None, local))
    assert "This run adds the noise at each owner" not in dp_advice(load_config("tiny", None, once))
