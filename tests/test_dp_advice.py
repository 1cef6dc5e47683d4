"""What an owner is told before a record-level DP run (tasks/dp_advice.py): the measured figures, from the file the
docs print, and only where they were measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trustformer.config import load_config
from trustformer.tasks.dp_advice import MEASURED_AT_EPSILON_8, dp_advice

ROOT = Path(__file__).resolve().parents[1]


def test_the_advice_quotes_the_measured_curve():
    curve = json.loads((ROOT / "docs" / "bench" / "dp-pays.json").read_text(encoding="utf-8"))["curve"]
    points = {p["records_per_owner"]: p for p in curve["dp ε=8 + fine-tuning"]["points"]}
    assert set(points) == set(MEASURED_AT_EPSILON_8)
    for records, (dp, fedavg) in MEASURED_AT_EPSILON_8.items():
        assert dp == pytest.approx(points[records]["gain_nats"], abs=1e-4)
        assert fedavg == pytest.approx(points[records]["fedavg_gain_nats"], abs=1e-4)


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
