import re
import pytest

from trustformer.cli import build_parser, resolve_config
from trustformer.config import ConfigError, PRESETS, RunConfig, build_config, load_config, parse_override


def test_presets_resolve_and_validate():
    for name in PRESETS:
        cfg = load_config(name)
        assert cfg.preset == name
    assert load_config("paper").model.n_encoder_layers == 6
    assert load_config("tiny").model.d_model < load_config("small").model.d_model


def test_precedence_preset_file_cli(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("seed = 7\n[federation]\nrounds = 9\nclients = 4\n[train]\nlr = 0.002\n")
    cfg = load_config("tiny", f, {"federation.rounds": 3})
    assert cfg.seed == 7 and cfg.federation.clients == 4 and cfg.train.lr == 0.002
    assert cfg.federation.rounds == 3  # command line beats the file
    assert cfg.model.d_model == PRESETS["tiny"]["model"]["d_model"]  # the file keeps the preset's rest


def test_unknown_key_is_named(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[federation]\nroundz = 3\n")
    with pytest.raises(ConfigError, match=r"federation\.roundz"):
        load_config("tiny", f)
    with pytest.raises(ConfigError, match="unknown config key colour"):
        build_config({"colour": 1})


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"federation.rounds": 0}, r"federation\.rounds = 0"),
        ({"trustformer.beta": 1.5}, r"trustformer\.beta = 1\.5"),
        ({"trustformer.beta": 0.0}, r"trustformer\.beta = 0\.0"),
        ({"federation.strategy": "fedsgd"}, r"federation\.strategy = 'fedsgd'"),
        ({"train.lr": "fast"}, r"train\.lr = 'fast' must be a number"),
        ({"train.batch_size": 2.5}, r"train\.batch_size = 2\.5 must be an integer"),
        ({"model.n_heads": 3}, r"model\.d_model = 128 must be divisible by model\.n_heads = 3"),
        ({"train.betas": [0.9]}, r"train\.betas"),
        ({"runtime.progress": "yes"}, r"runtime\.progress = 'yes' must be true or false"),
        ({"data.source": "tsv"}, r"data\.path is required"),
    ],
)
def test_bad_values_are_named(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("small", None, overrides)


def test_invalid_toml_and_missing_file(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("[federation\nrounds = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config("tiny", f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("tiny", tmp_path / "nope.toml")


def test_json_round_trip():
    cfg = load_config("tiny", None, {"trustformer.beta": 0.25, "train.betas": [0.8, 0.9]})
    assert RunConfig.from_json(cfg.to_json()) == cfg


def test_parse_override():
    assert parse_override("train.lr=3e-4") == ("train.lr", 3e-4)
    assert parse_override("runtime.progress=false") == ("runtime.progress", False)
    assert parse_override("data.tokenizer_name=xlm-roberta-base") == ("data.tokenizer_name", "xlm-roberta-base")
    with pytest.raises(ConfigError):
        parse_override("train.lr")


def test_cli_options_map_to_config(tmp_path):
    tsv = tmp_path / "c.tsv"
    args = build_parser().parse_args(
        [
            "run",
            "--preset",
            "tiny",
            "--strategy",
            "local",
            "--rounds",
            "4",
            "--clients",
            "2",
            "--seed",
            "3",
            "--data",
            str(tsv),
            "--beta",
            "0.3",
            "--agg-every",
            "2",
            "--set",
            "train.lr=0.01",
        ]
    )
    cfg = resolve_config(args)
    f = cfg.federation
    assert (f.strategy, f.rounds, f.clients, cfg.section("trustformer").beta, f.agg_every) == ("local", 4, 2, 0.3, 2)
    assert cfg.seed == 3 and cfg.train.lr == 0.01
    assert cfg.data.source == "tsv" and cfg.data.path == str(tsv)
    assert cfg.out.endswith("local-tiny-seed3")


def test_protocol_options_live_in_their_own_sections_and_old_keys_still_work_with_a_warning():
    from trustformer.config.run import deprecated_keys

    cfg = load_config("tiny", None, {"trustformer.beta": 0.25, "fedavg-topk.keep": 0.2, "fedpc.beta": 0.3})
    assert cfg.section("trustformer").beta == 0.25 and cfg.section("fedavg-topk").keep == 0.2
    assert cfg.section("fedpc").beta == 0.3 and cfg.section("phong").order == "fixed"  # defaults when not set
    assert not hasattr(cfg.federation, "beta") and not hasattr(cfg, "fedpc")
    for old, (section, key) in deprecated_keys().items():
        value = getattr(load_config("tiny", None, {}).section(section), key)
        with pytest.warns(FutureWarning, match=rf"{re.escape(old)} is deprecated .* use {re.escape(section)}\.{key}"):
            moved = load_config("tiny", None, {old: value})
        assert moved.section(section) == load_config("tiny", None, {f"{section}.{key}": value}).section(section)
    with pytest.raises(ConfigError, match=r"federation.beta and trustformer.beta are both set"):
        load_config("tiny", None, {"federation.beta": 0.25, "trustformer.beta": 0.5})
