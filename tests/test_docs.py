"""The documentation matches the code: the configuration reference is generated from the config classes, every
`trustformer` command the docs quote parses with the real argument parser, every page they link exists, and the
README stays a page a newcomer reads."""

import re
import shlex
from pathlib import Path

import pytest

from trustformer.bench import federation_bench, scale_bench
from trustformer.cli import build_parser
from trustformer.config.reference import reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_configuration_reference_is_current():
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == reference(), (
        "docs/configuration.md is stale: run `trustformer config --reference > docs/configuration.md`"
    )


def test_every_key_has_a_meaning():
    missing = [line for line in reference().splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not missing, missing


def commands(text: str) -> list[str]:
    """The `trustformer ...` commands of a page's code blocks (continued lines joined, comments dropped)."""
    found, blocks, language, lines = [], [], None, []
    for line in text.splitlines():  # fenced blocks, each opening fence paired with its closing one
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                if language in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(lines) + "\n")
                language = None
        elif language is not None:
            lines.append(line)
    for block in blocks:
        block = re.sub(r"\\\n\s*", " ", block)
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"\s*(?:&&|\|)\s*", line):
                part = re.sub(r"^(\.venv/bin/)?trustformer\b", "trustformer", part.strip())
                if part.startswith("trustformer "):
                    found.append(part)
    return found


BENCHES = {"federation": federation_bench.parse_args, "scale": scale_bench.parse_args}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_command_parses(page):
    parser = build_parser()
    for command in commands(page.read_text(encoding="utf-8")):
        argv = [a for a in shlex.split(command)[1:] if not a.startswith("<")]
        if argv[:1] == ["bench"] and argv[1:2] and argv[1] in BENCHES:
            BENCHES[argv[1]](argv[2:])
        elif argv[:2] == ["bench", "kmeans"]:
            continue  # its own parser, checked by its tests
        else:
            try:
                parser.parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"{page.name}: `{command}` does not parse ({exc})")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_linked_page_exists(page):
    for target in re.findall(r"\]\(([^)#]+?\.(?:md|png|json))\)", page.read_text(encoding="utf-8")):
        if not target.startswith("http"):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_readme_is_short_and_names_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 260
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text


def test_the_readmes_public_start_figures_are_the_measurements_they_name():
    """The README quotes two pretrainings of the split's public model and the UI-catalog model on two scales: each
    figure is the committed measurement (docs/bench/*.json) it says it is."""
    import json

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())

    def rows(name):
        return json.loads((ROOT / "docs" / "bench" / name).read_text(encoding="utf-8"))["rows"]

    def run(name, label):
        return next(r for r in rows(name) if r.get("run") == label)

    def alone(name):  # bench finetune: the public model before any fine-tuning
        return next(r for r in rows(name) if r["start"] == "public" and r["epochs"] == 0)

    bench = run("public.json", "public model")  # trustformer bench federation --public
    assert f"BLEU {bench['bleu']:.1f}, test loss {bench['loss']:.3f}" in text
    dp = alone("finetune-e8-bleu.json")  # the DP benchmarks' pretraining of the same split
    assert f"separate pretraining of it: {dp['test_loss']:.3f}, BLEU {dp['test_bleu']:.1f}" in text
    ui = alone("finetune-ui-dedup-e8.json")["test_loss"]
    scratch = [run("dp-recipe-ui-attacked.json", r)["loss"] for r in ("local", "fedavg")]
    public = [run("dp-recipe-ui-e8.json", r)["loss"] for r in ("public + local", "public + fedavg")]
    gain, gap = (scratch[0] - ui) / (scratch[0] - scratch[1]), (public[0] - ui) / (public[0] - public[1])
    assert f"gain {gain:.2f} on the from-scratch scale" in text and f"closes {gap:.2f} of the gap" in text
    # "I need a guarantee": every figure of its table is dp-pays.json's (scripts/dp_pays.py), before / after the
    # free fine-tuning
    pays = {r["run"]: r for r in rows("dp-pays.json")}
    for before, after in (
        ("public model", "control"),
        ("public + fedavg", "public + fedavg + fine-tuning"),
        ("dp ε=8", "dp ε=8 + fine-tuning"),
        ("dp ε=1", "dp ε=1 + fine-tuning"),
        ("dp ε=8 + fedadam", "dp ε=8 + fedadam + fine-tuning"),
        ("dp ε=8 distributed b=8", "dp ε=8 distributed b=8 + fine-tuning"),
    ):
        b, a = pays[before], pays[after]
        cells = [f"{b[k]:.3f} / {a[k]:.3f}" for k in ("loss", "own_loss")] + [f"{b['bleu']:.1f} / {a['bleu']:.1f}"]
        gain = "0" if after == "control" else "1" if "fedavg + fine" in after else f"{a['gain_loss']:.2f}"
        row = " | ".join(cells) + f" | — / {gain.replace('-', '−')} |"
        assert row in text, (before, row)
