"""`trustformer bench scale`: time per round and peak memory as clients grow, a fixed number drawn per round."""

import json
import os

import pytest
from helpers import jsonl

from trustformer_lab.bench.scale_bench import main, tree_rss_mb


def test_tree_memory_counts_this_process():
    assert tree_rss_mb(os.getpid()) > 10


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_scale_bench_measures_each_size_in_a_process_of_its_own(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert (
        main(
            [
                "--clients",
                "4,12",
                "--per-round",
                "3",
                "--rounds",
                "2",
                "--engines",
                "inprocess",
                "--out",
                str(tmp_path / "runs"),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["engine"], r["clients"], r["per_round"]) for r in rows] == [("inprocess", 4, 3), ("inprocess", 12, 3)]
    for r in rows:
        assert r["s_per_round"] > 0 and r["peak_mb"] > 100 and len(r["rounds_s"]) == 2
        lines = jsonl(tmp_path / "runs" / f"inprocess-{r['clients']}" / "metrics.jsonl")
        assert [len([x for x in lines if x.get("round") == k and "event" not in x]) for k in (1, 2)] == [3, 3]
    assert "s/round" in capsys.readouterr().out
