"""`trustformer bench kmeans` end to end on tiny inputs: every method side by side, the per-iteration
summary, real-weights and drift-sweep sections, and the JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trustformer_lab.bench import kmeans_bench


def _state(seed: int, base: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embedding.weight": (120, 16), "fc.weight": (48, 16), "fc.bias": (48,), "ln.weight": (16,)}
    out = {}
    for name, shape in shapes.items():
        step = torch.randn(*shape, generator=g)
        out[name] = step if base is None else base[name] + 0.3 * step
    return out


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_bench_runs_every_method_on_the_same_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _state(0)
    torch.save(before, tmp_path / "before.pt")
    torch.save({"model": _state(1, before), "optimizer": {}, "rounds_done": 2}, tmp_path / "after.pt")  # a snapshot
    report_file = tmp_path / "bench.json"
    rc = kmeans_bench.main(
        [
            "--shapes",
            "96x16",
            "--betas",
            "0.1,0.5",
            "--big-rows",
            "0",
            "--align-rows",
            "0",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--weights",
            str(tmp_path / "before.pt"),
            str(tmp_path / "after.pt"),
            "--drift-sweep",
            "0.5,1",
            "--json",
            str(report_file),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "per iteration, ours=sk against the faster library" in printed and "drift sweep" in printed
    report = json.loads(report_file.read_text())
    rows = report["rows"]
    assert {r["method"] for r in rows} >= {"ours", "ours=sk", "sklearn", "faiss", "faiss-t"}
    for case in ("96x16 b=0.1 k=9", "96x16 b=0.5 k=48"):
        for phase in ("cold", "warm"):
            by = {r["method"]: r for r in rows if r["case"] == case and r["phase"] == phase}
            # same start and stopping rule as scikit-learn: same iterations, same inertia
            assert by["ours=sk"]["iterations"] == by["sklearn"]["iterations"]
            assert by["ours=sk"]["inertia"] == pytest.approx(by["sklearn"]["inertia"], rel=1e-5)
            assert all(r["seconds"] > 0 for r in by.values())
    summary = report["per_iteration"]
    assert len(summary) == 4 and all(e["ratio"] > 0 and e["library"] in ("sklearn", "faiss") for e in summary)
    weights = report["weights"]
    assert weights["tensors"] == 4 and set(weights["betas"]) == {"0.1", "0.5"}
    for entry in weights["betas"].values():
        assert entry["warm_max_iter"] == 3
        assert entry["mean_iter"]["warm_capped"] <= 3 and entry["mean_iter"]["warm_capped_farthest"] <= 3
        assert entry["inertia"]["warm_capped_farthest"] <= entry["inertia"]["warm_capped"] * (1 + 1e-9)
    assert [(e["beta"], e["t"]) for e in report["drift_sweep"]] == [(0.1, 0.5), (0.1, 1.0), (0.5, 0.5), (0.5, 1.0)]
    for e in report["drift_sweep"]:
        assert e["keep"]["cold_over_cold_keep_inertia"] == pytest.approx(1.0)
        assert e["keep"]["warm_mean_iter"] >= 1 and e["farthest"]["warm_mean_iter"] >= 1


def test_bench_skips_a_missing_library_with_a_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kmeans_bench, "have", lambda module: module != "faiss")
    rc = kmeans_bench.main(
        [
            "--shapes",
            "40x8",
            "--betas",
            "0.5",
            "--big-rows",
            "0",
            "--align-rows",
            "0",
            "--repeats",
            "1",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "faiss: not installed, skipped" in out and "sklearn" in out


def test_bench_refuses_a_file_without_weights(tmp_path: Path) -> None:
    torch.save({"rounds_done": 3}, tmp_path / "junk.pt")
    with pytest.raises(SystemExit, match="holds no floating-point tensors"):
        kmeans_bench.load_state(str(tmp_path / "junk.pt"))
