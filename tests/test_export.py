"""Model folders (save / load / fingerprint), run folders, and the translate / predict commands."""

from __future__ import annotations

import argparse
import copy
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from trustformer import export as ex
from trustformer.data.tokenizer import HFTokenizer, train_sentencepiece
from trustformer.evaluation.translation import translate
from trustformer.export import commands as mc
from trustformer.models.fixup_resnet import FixupConfig, FixupResNet
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.models.unet import UNet, UNetConfig

torch.set_num_threads(1)

RU = ["кошка", "собака", "дом", "книга", "окно", "стол", "город", "река", "море", "лес"]
EN = ["cat", "dog", "house", "book", "window", "table", "city", "river", "sea", "forest"]
TEXTS = [f"{a} и {b} номер {i}" for i in range(15) for a, b in zip(RU, RU[1:], strict=False)] + [
    f"the {a} and the {b} number {i}" for i in range(15) for a, b in zip(EN, EN[1:], strict=False)
]
SOURCES = [f"{a} и {b}" for a, b in zip(RU, RU[1:], strict=False)] + ["дом", "книга и река номер 3"]
MAX_LEN = 16


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return train_sentencepiece(TEXTS, vocab_size=120, cache_dir=tmp_path_factory.mktemp("spm"), seed=0)


def tiny_model(tokenizer, seed: int, **overrides) -> Seq2SeqTransformer:
    """A tiny Transformer whose weights no fresh initialisation reproduces (noise from its own generator)."""
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=MAX_LEN,
        dropout=0.0,
        **overrides,
    )
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(config)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def model(tokenizer) -> Seq2SeqTransformer:
    return tiny_model(tokenizer, seed=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, model, tokenizer) -> Path:
    return ex.save_translation_model(
        tmp_path_factory.mktemp("saved") / "m",
        model,
        tokenizer,
        extra={"strategy": "fedavg", "round": 3, "clients": [0, 1]},
    )


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


# ------------------------------------------------------------------------------ save and load


def test_save_writes_the_folder(saved: Path, model, tokenizer) -> None:
    assert sorted(p.name for p in saved.iterdir()) == ["model.json", "model.safetensors", "tokenizer.model"]
    assert not [p for p in saved.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    tensors = load_file(str(saved / "model.safetensors"))
    state = model.state_dict()
    assert tensors.keys() == state.keys()  # the tied embedding once, as `embedding.weight`
    assert all(torch.equal(tensors[k], state[k]) for k in state)
    assert (saved / "tokenizer.model").read_bytes() == Path(tokenizer.model_file).read_bytes()
    meta = json.loads((saved / "model.json").read_text())
    assert meta["format"] == ex.FORMAT_NAME and meta["format_version"] == ex.FORMAT_VERSION
    assert meta["task"] == "translation"
    assert meta["config"]["d_model"] == 16 and meta["config"]["vocab_size"] == tokenizer.vocab_size
    assert meta["tokenizer"]["kind"] == "sentencepiece" and meta["tokenizer"]["file"] == "tokenizer.model"
    assert meta["fingerprint"] == ex.model_fingerprint(model)
    assert meta["extra"] == {"strategy": "fedavg", "round": 3, "clients": [0, 1]}


def test_load_round_trip(saved: Path, model, tokenizer) -> None:
    loaded, tok, meta = ex.load_translation_model(saved)
    assert not loaded.training
    assert loaded.config == model.config
    assert_same_state(model, loaded)
    assert tok.vocab_size == tokenizer.vocab_size and tok.name == tokenizer.name
    assert [tok.encode(s) for s in SOURCES] == [tokenizer.encode(s) for s in SOURCES]
    assert meta["extra"]["round"] == 3
    for beam in (1, 2):
        expected = translate(model, tokenizer, SOURCES, max_len=MAX_LEN, beam_size=beam)
        assert translate(loaded, tok, SOURCES, max_len=MAX_LEN, beam_size=beam) == expected
        assert any(expected)  # the comparison is not between empty strings


def test_load_reads_the_weights_file(tmp_path: Path, model, tokenizer) -> None:
    """Swap in another model's files: the loaded model must be that one, not a fresh initialisation."""
    other = tiny_model(tokenizer, seed=1)
    a = ex.save_translation_model(tmp_path / "a", model, tokenizer)
    b = ex.save_translation_model(tmp_path / "b", other, tokenizer)
    for name in ("model.safetensors", "model.json"):
        shutil.copy(b / name, a / name)
    loaded, _, _ = ex.load_translation_model(a)
    assert_same_state(other, loaded)
    assert ex.model_fingerprint(loaded) != ex.model_fingerprint(model)


def test_load_leaves_the_global_rng_alone(saved: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ex.load_translation_model(saved)
    assert torch.equal(torch.rand(3), expected)


def test_untied_and_shared_tensors(tmp_path: Path, tokenizer) -> None:
    """Untied embeddings save as three tensors; tensors that share memory are stored once (safetensors
    refuses shared storage) and restored under every name."""
    untied = tiny_model(tokenizer, seed=2, tie_embeddings=False)
    folder = ex.save_translation_model(tmp_path / "untied", untied, tokenizer)
    loaded, tok, _ = ex.load_translation_model(folder)
    assert_same_state(untied, loaded)
    shared = tiny_model(tokenizer, seed=3, tie_embeddings=False)
    shared.tgt_embedding.weight = shared.src_embedding.weight
    shared.lm_head.weight = shared.src_embedding.weight
    folder = ex.save_translation_model(tmp_path / "shared", shared, tokenizer)
    meta = json.loads((folder / "model.json").read_text())
    assert meta["aliases"] == {"tgt_embedding.weight": "src_embedding.weight", "lm_head.weight": "src_embedding.weight"}
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))
    loaded, tok, _ = ex.load_translation_model(folder)
    assert_same_state(shared, loaded)
    assert translate(loaded, tok, SOURCES, max_len=MAX_LEN) == translate(shared, tokenizer, SOURCES, max_len=MAX_LEN)


def test_resave_replaces_files(tmp_path: Path, model, tokenizer) -> None:
    other = tiny_model(tokenizer, seed=4)
    folder = ex.save_translation_model(tmp_path / "m", model, tokenizer)
    (folder / "tokenizer.json").write_text("{}")  # a stale file of another tokenizer kind
    ex.save_translation_model(folder, other, tokenizer)
    assert sorted(p.name for p in folder.iterdir()) == ["model.json", "model.safetensors", "tokenizer.model"]
    assert_same_state(other, ex.load_translation_model(folder)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_crash_while_saving_leaves_no_half_folder(tmp_path: Path, model, tokenizer, monkeypatch) -> None:
    import safetensors.torch

    old = ex.save_translation_model(tmp_path / "old", model, tokenizer)
    before = {p.name: p.read_bytes() for p in old.iterdir()}

    def crash(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        ex.save_translation_model(tmp_path / "new", model, tokenizer)
    with pytest.raises(OSError, match="disk full"):
        ex.save_translation_model(old, tiny_model(tokenizer, seed=6), tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no new folder, no temporary folder
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before


def test_bad_extra_writes_nothing(tmp_path: Path, model, tokenizer) -> None:
    with pytest.raises(TypeError, match="extra"):
        ex.save_translation_model(tmp_path / "m", model, tokenizer, extra={"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_hf_tokenizer_round_trip(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["<pad>", "<unk>", "<s>", "</s>", *RU, *EN, "и"]
    backend = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tok = HFTokenizer(backend, name="hf:test")
    m = tiny_model(tok, seed=5)
    folder = ex.save_translation_model(tmp_path / "hf", m, tok)
    assert (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").exists()
    loaded, tok2, meta = ex.load_translation_model(folder)
    assert meta["tokenizer"]["kind"] == "hf" and tok2.name == "hf:test"
    assert_same_state(m, loaded)
    assert translate(loaded, tok2, SOURCES, max_len=MAX_LEN, beam_size=2) == translate(
        m, tok, SOURCES, max_len=MAX_LEN, beam_size=2
    )


# --------------------------------------------------------------------------------- fingerprint


def test_fingerprint(model, tokenizer) -> None:
    fp = ex.model_fingerprint(model)
    assert len(fp) == 16 and int(fp, 16) >= 0
    twin = copy.deepcopy(model)
    assert ex.model_fingerprint(twin) == fp
    assert ex.model_fingerprint(twin.state_dict()) == fp
    with torch.no_grad():
        twin.encoder.layers[0].ffn.fc1.weight[0, 0] += 1e-6
    assert ex.model_fingerprint(twin) != fp
    assert ex.model_fingerprint(tiny_model(tokenizer, seed=0)) == fp  # rebuilt from scratch: same weights


def test_fingerprint_is_stable_across_processes() -> None:
    """A fixed value: the same bytes must give the same digest in any process and version."""
    state = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.tensor([1, 2], dtype=torch.int64)}
    assert ex.model_fingerprint(state) == "0852fcab5c72ecab"
    assert ex.model_fingerprint({**state, "b": state["b"].double()}) != "0852fcab5c72ecab"
    assert ex.model_fingerprint({**state, "b": state["b"].reshape(3, 2)}) != "0852fcab5c72ecab"


def test_export_model_names_folders_by_fingerprint(tmp_path: Path, model, tokenizer) -> None:
    folder = ex.export_model(tmp_path / "models", model, tokenizer=tokenizer, extra={"client": 0})
    assert folder == tmp_path / "models" / ex.model_fingerprint(model)
    stamp = (folder / "model.json").stat().st_mtime_ns
    assert ex.export_model(tmp_path / "models", copy.deepcopy(model), tokenizer=tokenizer) == folder
    assert (folder / "model.json").stat().st_mtime_ns == stamp  # the same model is not written twice


# ---------------------------------------------------------------------------------- errors


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ex.ExportError, match="does not exist"):
        ex.load_translation_model(tmp_path / "nope")


def test_folder_without_model_json(tmp_path: Path) -> None:
    with pytest.raises(ex.ExportError, match=r"is not a trained-model folder.*trustformer run"):
        ex.load_translation_model(tmp_path)


def test_unknown_format_version(tmp_path: Path, saved: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)
    meta = json.loads((folder / "model.json").read_text())
    meta["format_version"] = 99
    (folder / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ex.ExportError, match="format version 99.*upgrade"):
        ex.load_translation_model(folder)


def _rewrite_weights(folder: Path, change) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_tampered_tensor_shape(tmp_path: Path, saved: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)
    _rewrite_weights(folder, lambda t: t.update({"decoder.norm.weight": torch.ones(17)}))
    with pytest.raises(ex.ExportError, match=r"wrong shapes: decoder\.norm\.weight is \[17\].*\[16\]"):
        ex.load_translation_model(folder)


def test_missing_and_unexpected_tensors(tmp_path: Path, saved: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)

    def change(t):
        del t["encoder.norm.bias"]
        t["surprise"] = torch.zeros(2)

    _rewrite_weights(folder, change)
    with pytest.raises(ex.ExportError, match=r"missing tensors: encoder\.norm\.bias; unexpected tensors: surprise"):
        ex.load_translation_model(folder)


def test_tampered_values_break_the_fingerprint(tmp_path: Path, saved: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)
    _rewrite_weights(folder, lambda t: t["decoder.norm.weight"].add_(1.0))
    with pytest.raises(ex.ExportError, match="fingerprint"):
        ex.load_translation_model(folder)


def test_missing_weights_and_tokenizer(tmp_path: Path, saved: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)
    (folder / "tokenizer.model").unlink()
    with pytest.raises(ex.ExportError, match="tokenizer file tokenizer.model"):
        ex.load_translation_model(folder)
    shutil.copy(saved / "tokenizer.model", folder / "tokenizer.model")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ex.ExportError, match="no model.safetensors"):
        ex.load_translation_model(folder)


def test_wrong_task(tmp_path: Path, saved: Path) -> None:
    with pytest.raises(ex.ExportError, match="holds a translation model.*trustformer translate"):
        ex.load_image_model(saved)


def test_export_error_is_a_value_error() -> None:
    assert issubclass(ex.ExportError, ValueError)


# ------------------------------------------------------------------------------- run folders


def make_run(root: Path, models: dict[str, Path]) -> Path:
    run = root / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(
        json.dumps({"strategy": "fedavg", "models": {k: str(v.relative_to(run)) for k, v in models.items()}})
    )
    return run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, model, tokenizer) -> Path:
    root = tmp_path_factory.mktemp("runs")
    models = root / "run" / "models"
    a = ex.export_model(models, model, tokenizer=tokenizer)
    b = ex.export_model(models, tiny_model(tokenizer, seed=7), tokenizer=tokenizer)
    return make_run(root, {"2": b, "0": a, "1": a})


def test_find_models(run_dir: Path) -> None:
    models = ex.find_models(run_dir)
    assert list(models) == [0, 1, 2]
    assert models[0] == models[1] != models[2]
    assert all((p / "model.json").is_file() for p in models.values())


def test_find_models_errors(tmp_path: Path) -> None:
    with pytest.raises(ex.ExportError, match="does not exist"):
        ex.find_models(tmp_path / "nope")
    with pytest.raises(ex.ExportError, match="no summary.json"):
        ex.find_models(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"strategy": "fedavg"}))
    with pytest.raises(ex.ExportError, match="predates model export or did not finish; rerun it"):
        ex.find_models(tmp_path)


# ------------------------------------------------------------------------------------- CLI


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trustformer")
    sub = parser.add_subparsers(dest="command", required=True)
    mc.add_translate_parser(sub)
    mc.add_predict_parser(sub)
    return parser.parse_args(argv)


def test_translate_arguments(run_dir: Path, model, tokenizer, capsys) -> None:
    args = parse(["translate", "--run", str(run_dir), "--beam", "2", *SOURCES[:3]])
    assert args.func is mc.cmd_translate and args.client is None
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == translate(model, tokenizer, SOURCES[:3], max_len=MAX_LEN, beam_size=2)
    assert parse(["translate", "--run", "x"]).beam == mc.DEFAULT_BEAM == 4


def test_translate_stdin_in_order(run_dir: Path, tokenizer, monkeypatch, capsys) -> None:
    other = tiny_model(tokenizer, seed=7)
    lines = SOURCES * 4  # 40 sentences and an empty line: batches of --batch-size 16
    text = "\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    args = parse(["translate", "--run", str(run_dir), "--client", "2", "--beam", "1", "--batch-size", "16"])
    assert mc.cmd_translate(args) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[-1] == ""
    expected = translate(other, tokenizer, lines, max_len=MAX_LEN)
    assert out[:-1] == expected[:5] + [""] + expected[5:]


def test_translate_unknown_client(run_dir: Path) -> None:
    with pytest.raises(ex.ExportError, match="has no client 5: its clients are 0, 1, 2"):
        mc.cmd_translate(parse(["translate", "--run", str(run_dir), "--client", "5", "hello"]))


def test_translate_max_len(run_dir: Path, model, tokenizer, capsys) -> None:
    mc.cmd_translate(parse(["translate", "--run", str(run_dir), "--beam", "1", "--max-len", "3", SOURCES[0]]))
    out = capsys.readouterr().out.splitlines()
    assert out == translate(model, tokenizer, SOURCES[:1], max_len=3)


def test_an_empty_translation_is_warned_once_naming_the_tiny_preset(run_dir: Path, monkeypatch, capsys) -> None:
    assert mc.empty_translation_warning(3, "tiny") == (
        "trustformer translate: warning: the model produced an empty translation for line 3; runs of the tiny "
        "preset are too small to translate (it is for tests and smoke runs) — use --preset small"
    )
    assert "undertrained" in mc.empty_translation_warning(1, "small") and mc.run_preset(run_dir) is None
    tiny_run = run_dir.parent / "tiny-run"
    shutil.copytree(run_dir, tiny_run)
    summary = json.loads((tiny_run / "summary.json").read_text())
    (tiny_run / "summary.json").write_text(json.dumps({**summary, "config": {"preset": "tiny"}}))
    assert mc.run_preset(tiny_run) == "tiny"
    blank = lambda model, tok, texts, **kw: ["" if "дом" in t else "a house" for t in texts]  # noqa: E731
    monkeypatch.setattr("trustformer.evaluation.translation.translate", blank)
    lines = ["кошка", "", "дом", "дом и море", "лес"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert mc.cmd_translate(parse(["translate", "--run", str(tiny_run), "--batch-size", "2"])) == 0  # still 0
    out, err = capsys.readouterr()
    assert out.split("\n") == ["a house", "", "", "", "a house", ""]
    assert err.splitlines() == [
        mc.empty_translation_warning(3, "tiny"),
        "trustformer translate: warning: 2 of 4 translations were empty",
    ]


# ---------------------------------------------------------------------------------- images


def noisy(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model.eval()


DIGITS_SPEC = {
    "dataset": "digits",
    "channels": 1,
    "height": 8,
    "width": 8,
    "scale": 255.0,
    "mean": [0.3068],
    "std": [0.3757],
    "classes": [str(i) for i in range(10)],
}


def test_image_classification_round_trip_and_predict(tmp_path: Path, capsys) -> None:
    from PIL import Image

    from trustformer.tasks.image_data import to_float

    torch.manual_seed(0)
    net = noisy(FixupResNet(FixupConfig(layers=(1, 1), widths=(4, 8), in_channels=1, num_classes=10)), 1)
    folder = ex.export_model(tmp_path / "run" / "models", net, input_spec=DIGITS_SPEC, extra={"round": 2})
    loaded, meta = ex.load_image_model(folder)
    assert_same_state(net, loaded)
    assert meta["task"] == "image-classification" and meta["input"]["classes"][3] == "3"
    with pytest.raises(ex.ExportError, match="holds a image-classification model.*trustformer predict"):
        ex.load_translation_model(folder)
    run = make_run(tmp_path, {"0": folder})
    rng = np.random.default_rng(0)
    images = tmp_path / "images"
    images.mkdir()
    pixels = [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(3)]
    for i, arr in enumerate(pixels):
        Image.fromarray(arr).save(images / f"img{i}.png")
    Image.fromarray(rng.integers(0, 256, (20, 14, 3), dtype=np.uint8)).save(images / "big.jpg")
    (images / "notes.txt").write_text("not an image")
    assert mc.cmd_predict(parse(["predict", "--run", str(run), str(images)])) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [Path(r[0]).name for r in rows] == ["big.jpg", "img0.png", "img1.png", "img2.png"]
    x = to_float(torch.from_numpy(np.stack(pixels))[:, None], "digits")
    with torch.no_grad():
        probs = torch.softmax(net(x), dim=1)
    for row, p in zip(rows[1:], probs, strict=False):
        assert row[1] == str(int(p.argmax())) and float(row[2]) == pytest.approx(float(p.max()), abs=1e-4)


def test_image_input_spec_from_the_digits_task() -> None:
    from trustformer.config import image_preset
    from trustformer.tasks.image import ImageClassificationTask

    spec = ex.image_input_spec(ImageClassificationTask(image_preset("tiny")))
    assert spec == DIGITS_SPEC


def test_segmentation_round_trip_and_predict(tmp_path: Path, capsys) -> None:
    from PIL import Image

    torch.manual_seed(0)
    net = noisy(UNet(UNetConfig(in_channels=3, depth=2, base_width=4, groups=4)), 2)
    spec = {"dataset": "lgg", "channels": 3, "height": 16, "width": 16, "intensity": {"scale": 255.0}, "threshold": 0.5}
    folder = ex.save_image_model(tmp_path / "run" / "models" / "u", net, spec)
    loaded, meta = ex.load_image_model(folder)
    assert_same_state(net, loaded)
    run = make_run(tmp_path, {"0": folder})
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "slice.png")
    Image.fromarray(rng.integers(0, 256, (40, 24, 3), dtype=np.uint8)).save(tmp_path / "large.png")
    out = tmp_path / "masks"
    args = parse(
        ["predict", "--run", str(run), "--out", str(out), str(tmp_path / "slice.png"), str(tmp_path / "large.png")]
    )
    assert mc.cmd_predict(args) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [Path(r[1]) for r in rows] == [out / "slice.mask.png", out / "large.mask.png"]
    mask = np.asarray(Image.open(out / "slice.mask.png"))
    x = torch.from_numpy(arr.astype(np.float32) / 255.0).permute(2, 0, 1)[None]
    with torch.no_grad():
        expected = (torch.sigmoid(net(x))[0, 0] > 0.5).numpy()
    assert mask.shape == (16, 16) and set(np.unique(mask)) <= {0, 255}
    assert np.array_equal(mask == 255, expected)
    assert float(rows[0][2]) == pytest.approx(expected.mean(), abs=1e-4)
    assert np.asarray(Image.open(out / "large.mask.png")).shape == (40, 24)


def test_image_spec_is_checked(tmp_path: Path) -> None:
    net = FixupResNet(FixupConfig(layers=(1,), widths=(4,), in_channels=1, num_classes=10))
    with pytest.raises(ValueError, match="classes"):
        ex.save_image_model(tmp_path / "m", net, {**DIGITS_SPEC, "classes": ["a", "b"]})
    with pytest.raises(ValueError, match="channels=3"):
        ex.save_image_model(tmp_path / "m", net, {**DIGITS_SPEC, "channels": 3})
    assert not (tmp_path / "m").exists()
