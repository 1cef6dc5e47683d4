import re

import pytest

from trustformer.cli import build_parser, resolve_config
from trustformer.config import PRESETS, ConfigError, RunConfig, build_config, load_config, parse_override


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
        (
            {"federation.strategy": "centralized", "runtime.engine": "simulation"},
            r"trains one client on every shard: run it with runtime\.engine = 'inprocess'",
        ),
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
            "--agg-every",
            "2",
            "--set",
            "train.lr=0.01",
        ]
    )
    cfg = resolve_config(args)
    f = cfg.federation
    assert (f.strategy, f.rounds, f.clients, f.agg_every) == ("local", 4, 2, 2)
    assert cfg.seed == 3 and cfg.train.lr == 0.01
    assert cfg.data.source == "tsv" and cfg.data.path == str(tsv)
    # the default folder: the stem, then the settings that differ from the preset's (docs/outputs.md)
    settings = "path=[0-9a-f]{8}-source=tsv-agg_every=2-clients=2-rounds=4-train.lr=0.01"  # by key; a path hashed
    assert re.fullmatch(rf"runs[/\\]local-tiny-seed3-{settings}", cfg.out), cfg.out


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


@pytest.mark.parametrize(
    "typo, hint",
    [
        ("train.lrr=1", "unknown config key train.lrr: did you mean train.lr?"),
        ("federation.rouns=3", "unknown config key federation.rouns: did you mean federation.rounds?"),
        ("federaton.rounds=3", "unknown config section federaton: did you mean federation?"),
        ("federation.mu=0.1", "unknown config key federation.mu: did you mean fedprox.mu?"),
        ("fedprox.muu=0.1", "unknown config key fedprox.muu: did you mean fedprox.mu?"),
    ],
)
def test_a_mistyped_key_or_section_gets_the_closest_valid_name(typo, hint, tmp_path, capsys):
    from trustformer.cli import main

    assert main(["config", "--preset", "tiny", "--set", typo]) == 2
    assert f"trustformer: configuration error: {hint} (" in capsys.readouterr().err
    dotted, _, value = typo.partition("=")
    section, _, key = dotted.partition(".")
    toml = tmp_path / "run.toml"
    toml.write_text(f"[{section}]\n{key} = {value}\n")
    assert main(["config", "--preset", "tiny", "--config", str(toml)]) == 2  # the same in a --config file
    assert hint in capsys.readouterr().err


def test_an_unknown_section_lists_the_protocols_sections_and_not_the_internal_field(capsys):
    from trustformer.cli import main

    assert main(["config", "--preset", "tiny", "--set", "colour.x=1"]) == 2
    err = capsys.readouterr().err
    listed = re.search(r"\(sections: ([^;]*); top-level keys: ([^)]*)\)", err)
    assert listed and "did you mean" not in err, err
    sections, top = listed[1].split(", "), listed[2].split(", ")
    assert {"trustformer", "fedprox", "fedpc", "phong", "fedavg-topk", "federation", "train"} <= set(sections)
    assert "sections" not in sections + top and top == ["out", "preset", "seed", "task"]
    with pytest.raises(ConfigError, match=r"unknown config key colour \(sections: "):
        build_config({"colour": 1})


def test_a_protocol_section_the_strategy_does_not_use_is_refused(capsys):
    from trustformer.cli import main

    assert main(["config", "--preset", "tiny", "--strategy", "fedavg", "--set", "trustformer.beta=0.3"]) == 2
    assert capsys.readouterr().err == (
        "trustformer: configuration error: trustformer.beta is set but --strategy fedavg does not use the "
        "[trustformer] section; drop it or use --strategy trustformer\n"
    )
    assert main(["config", "--preset", "tiny", "--strategy", "fedavg", "--beta", "0.3"]) == 2  # --beta: the same
    assert main(["config", "--preset", "tiny", "--strategy", "local", "--set", "fedprox.mu=0.5"]) == 2
    assert "fedprox.mu is set but --strategy local does not use the [fedprox] section" in capsys.readouterr().err
    assert main(["config", "--preset", "tiny", "--strategy", "trustformer", "--beta", "0.3"]) == 0
    assert "[trustformer]\nbeta = 0.3\n" in capsys.readouterr().out
    # a section's defaults set again is no setting; a sweep's strategies may use it (attack --strategies)
    assert main(["config", "--preset", "tiny", "--strategy", "fedavg", "--set", "fedprox.mu=0.01"]) == 0
    load_config("tiny", None, {"trustformer.beta": 0.3}, used_by=("fedavg", "trustformer"))
    with pytest.raises(ConfigError, match=r"none of the strategies run \(fedavg, local\) uses the \[trustformer\]"):
        load_config("tiny", None, {"trustformer.beta": 0.3}, used_by=("local",))
    # a configuration built from another (resume, the Flower boundary, a sweep's runs) is not the user's: no check
    tf = load_config("tiny", None, {"federation.strategy": "trustformer", "trustformer.beta": 0.3}, used_by=())
    other = load_config("tiny", None, {**tf.flat(), "federation.strategy": "fedavg"})
    assert RunConfig.from_json(other.to_json()) == build_config(other.to_dict()) == other


def test_every_preset_loads_with_every_strategy():
    from trustformer.registry import protocol_spec, protocol_specs

    data = {"image-classification": {"image.data_dir": "cifar"}, "segmentation": {"segmentation.data_dir": "lgg"}}
    for preset in PRESETS:
        for spec in protocol_specs():
            for task in spec.tasks or ("translation",):
                own = data.get(task, {}) if preset == "paper" else {}  # the paper's datasets: a folder to name
                values = {"federation.strategy": spec.name, "task": task, **own}
                cfg = load_config(preset, None, values, used_by=())
                assert cfg.federation.strategy == spec.name and cfg.preset == preset
    assert protocol_spec("fedpc").tasks  # an image strategy among them


def _absurd_values(default):
    """Out-of-range and ill-typed values for an option whose default is ``default``, as ``--set`` writes them."""
    if isinstance(default, bool):
        return ["maybe"]
    if isinstance(default, (int, float)):
        return ["-1", "1e400", "'ten'"]
    if isinstance(default, str):
        return ["'no-such-value'"]
    return ["'x'", "[[1]]"]  # lists and tables


def _every_option():
    from trustformer.registry import protocol_specs

    options = [(key, default, None) for key, default in RunConfig().flat().items() if key != "out"]
    for spec in protocol_specs():
        if spec.section is not None:
            options += [(f"{spec.name}.{k}", v, spec.name) for k, v in vars(spec.section()).items()]
    return options


def test_an_out_of_range_value_for_every_option_is_refused_without_a_traceback(capsys):
    """Every option, each with absurd values (negative, infinite, the wrong type, an unknown choice): `trustformer
    config` either accepts it or refuses it with a configuration error naming the option (what `main` prints as one
    line, exit 2), never another exception (a traceback). One parser for all, as `main` builds for each."""
    from trustformer.cli import main

    parser = build_parser()
    refused = 0
    for key, default, strategy in _every_option():
        for value in _absurd_values(default):
            argv = ["config", "--preset", "tiny", "--set", f"{key}={value}"]
            if strategy:
                argv += ["--strategy", strategy]
            args = parser.parse_args(argv)
            try:
                args.func(args)
            except ConfigError as exc:
                refused += 1
                assert key.rsplit(".", 1)[-1] in str(exc), (argv, exc)
    capsys.readouterr()
    assert main(["config", "--set", "runtime.store=dsk"]) == 2
    assert "(did you mean disk?)" in capsys.readouterr().err  # a mistyped choice, like a mistyped key
    assert refused > 250  # the check above sees refusals, not only values taken as they are
