import json

import tomllib

from trustformer.cli import main
from trustformer.config import load_config


def test_config_command_prints_a_loadable_config(tmp_path, capsys):
    assert main(["config", "--preset", "tiny", "--rounds", "3", "--set", "train.lr=0.002"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "run.toml"
    path.write_text(text)
    cfg = load_config("small", path)  # the file names its preset; it wins over the default
    assert cfg.preset == "tiny" and cfg.federation.rounds == 3 and cfg.train.lr == 0.002
    assert tomllib.loads(text)["model"]["d_model"] == 32


def test_bad_config_value_exits_2_naming_it(capsys):
    assert main(["run", "--preset", "tiny", "--set", "trustformer.beta=2"]) == 2
    assert "trustformer.beta = 2" in capsys.readouterr().err


def test_malformed_tsv_exits_1_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("привет\thello\nno tab here\n", encoding="utf-8")
    assert main(["run", "--preset", "tiny", "--data", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "line 2" in err and "bad.tsv" in err


def test_own_corpus_too_small_for_the_split_is_explained(tmp_path, capsys):
    small = tmp_path / "small.tsv"
    small.write_text("".join(f"привет {i}\thello {i}\n" for i in range(50)), encoding="utf-8")
    assert main(["run", "--preset", "tiny", "--data", str(small), "--out", str(tmp_path / "o")]) == 1
    assert "trustformer: error:" in capsys.readouterr().err


def test_own_corpus_without_domains_runs_iid_and_dirichlet_says_it_needs_domains(tmp_path, capsys):
    corpus = tmp_path / "plain.tsv"
    corpus.write_text("".join(f"привет номер {i}\thello number {i}\n" for i in range(1800)), encoding="utf-8")
    base = [
        "run",
        "--preset",
        "tiny",
        "--data",
        str(corpus),
        "--set",
        "eval.meteor=false",
        "--set",
        "eval.bertscore=false",
        "--quiet",
    ]
    assert main(base + ["--out", str(tmp_path / "iid")]) == 0
    assert main(base + ["--out", str(tmp_path / "dir"), "--set", "data.partition=dirichlet"]) == 1
    err = capsys.readouterr().err
    assert "needs a domain for every pair" in err and "third column `domain`" in err


def test_own_corpus_with_domains_partitions_by_them(tmp_path):
    import json

    corpus = tmp_path / "domains.tsv"
    corpus.write_text(
        "".join(f"привет номер {i}\thello number {i}\t{'abc'[i % 3]}\n" for i in range(1800)), encoding="utf-8"
    )
    assert (
        main(
            [
                "run",
                "--preset",
                "tiny",
                "--data",
                str(corpus),
                "--set",
                "eval.meteor=false",
                "--set",
                "eval.bertscore=false",
                "--set",
                "data.partition=domain",
                "--quiet",
                "--out",
                str(tmp_path / "dom"),
            ]
        )
        == 0
    )
    clients = json.loads((tmp_path / "dom" / "summary.json").read_text())["data"]["clients"]
    held = [set(c["domains"]) for c in clients.values()]
    assert sorted(map(sorted, held)) == [["a"], ["b"], ["c"]]
    assert all(set(c["test_domains"]) == {"a", "b", "c"} for c in clients.values())


def test_a_second_run_into_a_finished_runs_folder_is_refused_and_the_first_is_kept(tmp_path, capsys):
    from trustformer.cli import main

    out = tmp_path / "run"
    quick = ["--preset", "tiny", "--out", str(out), "--quiet", "--set", "eval.meteor=false"]
    quick += ["--set", "eval.bertscore=false"]
    assert main(["run", "--rounds", "1", *quick]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["run", "--rounds", "2", *quick]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run" in err and "--out DIR" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == first  # nothing replaced
    (out / "summary.json").unlink()  # as if interrupted after its checkpoint
    assert main(["run", "--rounds", "2", *quick]) == 2
    assert "holds an interrupted run" in capsys.readouterr().err
    assert main(["run", "--rounds", "2", "--overwrite", *quick]) == 0
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2


def test_version_prints_the_installed_version(capsys):
    import pytest

    from trustformer import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"trustformer {__version__}\n"


def test_out_at_or_under_a_file_is_a_configuration_error_naming_it_before_any_data_loads(tmp_path, capsys, monkeypatch):
    import trustformer.engine

    def no_run(cfg):
        raise AssertionError("the run (and its data) started before --out was checked")

    monkeypatch.setattr(trustformer.engine, "run", no_run)
    plain = tmp_path / "somefile"
    plain.write_text("not a folder\n")
    for out, says in ((plain / "run", f"lies under {plain}, which is a file"), (plain, f"{plain} is a file")):
        for extra in ([], ["--overwrite"]):
            assert main(["run", "--preset", "tiny", "--rounds", "1", "--out", str(out), *extra]) == 2
            err = capsys.readouterr().err
            assert err.startswith("trustformer: configuration error: --out (out):") and says in err, err
            assert "Traceback" not in err
    assert plain.read_text() == "not a folder\n"


def _interrupted_run(folder, store):
    from trustformer.runtime.checkpoint import Checkpoint, write_checkpoint

    folder.mkdir()
    cfg = load_config("tiny", None, {"out": str(folder), "runtime.store": store})
    write_checkpoint(folder, Checkpoint(round=1, config=cfg.to_dict(), lines=[]))


def test_an_interrupted_run_kept_in_memory_is_not_offered_resume(tmp_path, capsys):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    _interrupted_run(memory, "memory")
    _interrupted_run(disk, "disk")
    assert main(["run", "--preset", "tiny", "--rounds", "1", "--out", str(memory)]) == 2
    err = capsys.readouterr().err
    assert "cannot be resumed" in err and "runtime.store = memory" in err and "--resume" not in err
    assert "--out DIR" in err and "--overwrite" in err
    assert main(["run", "--preset", "tiny", "--rounds", "1", "--out", str(disk)]) == 2
    assert f"trustformer run --resume {disk}" in capsys.readouterr().err


def test_a_deprecated_key_is_one_warning_line_without_python_source(capsys):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert (
            main(["config", "--preset", "tiny", "--strategy", "fedavg-topk", "--set", "federation.topk_keep=0.25"]) == 0
        )
    err = capsys.readouterr().err
    assert err == (
        "trustformer: warning: federation.topk_keep is deprecated and will be removed in the next release: "
        "use fedavg-topk.keep\n"
    )


def test_a_deprecated_key_warns_at_the_callers_line():
    import pytest

    with pytest.warns(FutureWarning, match="federation.topk_keep is deprecated") as caught:
        load_config("tiny", None, {"federation.topk_keep": 0.25})
    assert [w.filename for w in caught] == [__file__]


def _out(*argv: str) -> str:
    import shlex

    from trustformer.cli import build_parser
    from trustformer.cli_options import run_config

    return run_config(build_parser().parse_args(["run", *(a for arg in argv for a in shlex.split(arg))])).out


def test_the_default_output_folder_names_every_setting_that_differs_from_the_preset(tmp_path):
    from pathlib import Path

    assert Path(_out()) == Path("runs", "fedavg-small-seed0")  # the demo's, which the README's translate line reads
    assert Path(_out("--strategy trustformer --beta 0.5")) == Path("runs", "trustformer-small-seed0")  # β's default
    assert Path(_out("--secure secagg")) == Path("runs", "fedavg-small-seed0-mode=secagg")
    assert Path(_out("--preset tiny --set privacy.delta=1e-5 --set train.lr=3e-4")) == Path(
        "runs",
        "fedavg-tiny-seed0-delta=1e-05-train.lr=0.0003",  # lr: image.lr is another option
    )
    assert Path(_out("--task segmentation --preset tiny")) == Path("runs", "segmentation-fedavg-tiny-seed0")
    # the settings decide, not how they were given: the same run from --set in another order, or from a file
    config = tmp_path / "run.toml"
    config.write_text('[federation]\npayload_bits = 4\n[model]\nadapters = "lora"\n[train]\ninit = "public"\n')
    public = _out("--set train.init=public --set model.adapters=lora --set federation.payload_bits=4")
    assert public == _out("--set federation.payload_bits=4 --set model.adapters=lora --set train.init=public")
    assert (
        public
        == _out(f"--config {config}")
        == str(Path("runs", "fedavg-small-seed0-payload_bits=4-adapters=lora-init=public"))
    )
    # a value that is no plain word, by its hash: different faults, different folders
    scale, nan = (
        _out("--preset tiny", f"--set 'federation.faults=[\"client=1,round=*,kind={k}\"]'")
        for k in ("scale", "sign_flip")
    )
    assert scale != nan and all(Path(x).name.startswith("fedavg-tiny-seed0-faults=") for x in (scale, nan))
    assert Path(_out("--preset tiny --out elsewhere")) == Path("elsewhere")


def test_the_audit_runs_at_a_delta_that_gives_it_power_unless_one_is_set(tmp_path, capsys):
    """The presets' δ = 1e-3 leaves the one-run bound no power with 10,000 canaries (2mδ = 20): `attack audit` runs at
    δ = 1e-5 where the user set none, and there a leak ε = 1 does not allow is audited above ε (scores of a
    Gaussian mechanism, shift 1: no audit run needed); a δ the user sets is kept, with the warning."""
    import numpy as np

    from trustformer.cli import build_parser
    from trustformer_lab.attack.audit import one_run_epsilon_lower_bound
    from trustformer_lab.attack.cli import audit_config, power_warning

    def audit(*options):
        return audit_config(build_parser().parse_args(["attack", "audit", "--preset", "tiny", *options]))

    cfg, m = audit("--set", "privacy.batch_size=60")  # the README's example
    assert (m, cfg.privacy.delta, cfg.privacy.unit) == (10_000, 1e-5, "record") and power_warning(
        m, cfg.privacy.delta
    ) is None
    client, n = audit("--level", "client")
    assert (n, client.privacy.delta) == (2000, 1e-5) and power_warning(n, client.privacy.delta) is None
    many, k = audit("--canaries", "50000")
    assert many.privacy.delta == 1e-6 and power_warning(k, many.privacy.delta) is None
    rng = np.random.default_rng(0)
    included = rng.random(m) < 0.5
    scores = rng.normal(size=m) + included
    assert one_run_epsilon_lower_bound(scores, included, cfg.privacy.delta)["epsilon_lb"] > cfg.privacy.epsilon
    assert one_run_epsilon_lower_bound(scores, included, 1e-3)["epsilon_lb"] == 0.0  # the presets' δ: nothing shows
    # a δ the user sets, on the command line or in a file, is kept, and one without power warned about
    assert audit("--set", "privacy.delta=1e-3")[0].privacy.delta == 1e-3 and "no power" in power_warning(m, 1e-3)
    config = tmp_path / "audit.toml"
    config.write_text("[privacy]\ndelta = 1e-4\n")
    assert audit("--config", str(config))[0].privacy.delta == 1e-4
