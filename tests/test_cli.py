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
    assert main(["run", "--preset", "tiny", "--set", "federation.beta=2"]) == 2
    assert "federation.beta = 2" in capsys.readouterr().err


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
