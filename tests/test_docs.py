"""The documentation matches the code: the configuration reference is generated from the config classes, every
`trustformer` command the docs quote parses with the real argument parser, every page they link exists, and the
README stays a page a newcomer reads."""

import re
import shlex
from pathlib import Path

import pytest

from trustformer.cli import build_parser
from trustformer.config.reference import reference
from trustformer_lab.bench import federation_bench, scale_bench

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
    """The `trustformer ...` commands of a page's code blocks (continued lines joined, comments dropped), in page
    order; `bash scripts/demo.sh ARGS` is `trustformer run ARGS` after the installation."""
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
                part = re.sub(r"^bash scripts/demo\.sh\b", "trustformer run", part)
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


def quoted_commands() -> list[tuple[str, str, list[str]]]:
    """Every command the docs quote, in the order a reader pastes them (README first, then docs/*.md): (page,
    command, its arguments; placeholders such as `<file>` dropped, `HEX` given a value)."""
    found = []
    for page in PAGES:
        for command in commands(page.read_text(encoding="utf-8")):
            argv = [a.replace("=HEX", "=" + "0" * 64) for a in shlex.split(command)[1:] if not a.startswith("<")]
            found.append((page.name, command, argv))
    return found


def test_the_quoted_runs_write_folders_of_their_own():
    """Pasted in order into a fresh clone, every quoted `trustformer run` (`bash scripts/demo.sh`) and `trustformer
    deploy server|local` writes its own output folder: the default one names the settings that differ from the
    preset's, so no run is refused for a folder an earlier, different command filled. A command quoted twice (the
    same run again) is refused with what to do (--out or --overwrite); --resume and --overwrite reuse a folder by
    design. `attack`, `bench` and `reproduce` write scratch and cache folders they reuse or replace themselves
    (runs/attack-*, runs/bench-*, results/<preset> or their --out): none is a run's folder, or holds or lies in one."""
    import os

    from trustformer.cli_options import run_config
    from trustformer.config import STRATEGIES

    parser = build_parser()
    runs: dict[str, tuple[str, str, list[str]]] = {}  # folder -> the first command writing it
    scratch = []
    for page, command, argv in quoted_commands():
        if argv[:1] == ["run"] or argv[:2] in (["deploy", "server"], ["deploy", "local"]):
            if "--resume" in argv or "--overwrite" in argv:
                continue
            folder = os.path.normpath(run_config(parser.parse_args(argv)).out)
            entry = (page, command, argv)
            first = runs.setdefault(folder, entry)
            if first is not entry and (first[2] != argv or argv[0] != "run"):
                pytest.fail(f"{page}: `{command}` writes {folder}, which {first[0]}'s `{first[1]}` wrote before")
        elif "--run" in argv:  # translate, predict, ...: a folder a run quoted before it writes
            folder = os.path.normpath(argv[argv.index("--run") + 1])
            assert folder in runs, f"{page}: `{command}` reads {folder}, which no command quoted before it writes"
        elif argv[:1] in (["attack"], ["bench"], ["reproduce"]) and "--out" in argv:
            scratch.append((page, command, os.path.normpath(argv[argv.index("--out") + 1])))
    for page, command, folder in scratch:
        for run in runs:
            inside = os.path.commonpath([run, folder]) in (run, folder)
            assert not inside, f"{page}: `{command}` writes into {folder}, beside the run folder {run}"
    # the scratch folders' default names cannot be a run's default folder, runs/[<task>-]<strategy>-<preset>-...
    assert not {"attack", "bench"} & {s.split("-")[0] for s in STRATEGIES}
    # docs/outputs.md's examples of default folders are the parser's
    outputs = " ".join((ROOT / "docs" / "outputs.md").read_text(encoding="utf-8").split())
    examples = re.findall(r"`(?:trustformer run )?(--[^`]*)` writes\s+`([^`]+)`", outputs)
    assert len(examples) == 2
    for options, folder in examples:
        assert os.path.normpath(run_config(parser.parse_args(["run", *shlex.split(options)])).out) == folder
    # the README's demo writes the folder its translate line reads
    assert runs[os.path.join("runs", "fedavg-small-seed0")][0] == "README.md"
    assert "translate --run runs/fedavg-small-seed0 " in (ROOT / "README.md").read_text(encoding="utf-8")


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
    # the UI-catalog model, pretrained twice: alone (its gain on seed 0's from-scratch scale, public.json's references,
    # and its share of the public-start gap) and for the DP table's runs
    ui = alone("finetune-ui-dedup-e8.json")
    assert f"once alone at {ui['test_loss']:.3f}, BLEU {ui['test_bleu']:.1f}" in text
    pays_public = run("dp-pays.json", "public model")
    assert f"for the DP table below at {pays_public['loss']:.3f}, BLEU {pays_public['bleu']:.1f}" in text
    scratch = [run("public.json", r)["loss"] for r in ("local", "fedavg")]
    public = [run("dp-recipe-ui-e8.json", r)["loss"] for r in ("public + local", "public + fedavg")]
    loss = ui["test_loss"]
    gain, gap = (scratch[0] - loss) / (scratch[0] - scratch[1]), (public[0] - loss) / (public[0] - public[1])
    assert f"gain {gain:.2f} on seed 0's from-scratch scale" in text and f"closes {gap:.2f} of the gap" in text
    assert (
        "public + FedAvg beats from-scratch FedAvg ({:.3f} against {:.3f})".format(
            run("public.json", "public + fedavg")["loss"], scratch[1]
        )
        in text
    )
    lora = run("download.json", "public-ui + fedavg lora r16 4-bit · down 4")
    low, high = sorted(lora["gain_loss_per_seed"])
    share = max(lora["upload_vs_fedavg"], lora["download_vs_fedavg"])
    assert f"ends at gain {low:.2f}–{high:.2f} for {share:.1%} of the bytes each way" in text
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


# ---------------------------------------------------------------------------------------------------- figures
# Every figure the README and the pages it links quote from a benchmark is read here from its JSON (docs/bench/),
# to the digits shown: a table copying a JSON cell by cell (check_table), prose figures by explicit asserts, and a
# printed table by rendering it again. Rerunning a benchmark without updating the page fails here.

NUMBER = re.compile(r"[+−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[+−-]?\d+)?")


def bench(name: str) -> dict:
    import json

    return json.loads((ROOT / "docs" / "bench" / name).read_text(encoding="utf-8"))


def by_run(name: str, key: str = "run") -> dict[str, dict]:
    return {row[key]: row for row in bench(name)["rows"]}


def page(name: str) -> str:
    """A page's text with its whitespace collapsed (prose figures wrap across lines)."""
    path = ROOT / "README.md" if name == "README.md" else ROOT / "docs" / name
    return " ".join(path.read_text(encoding="utf-8").split())


def shown(value: float, like: str) -> str:
    """``value`` written as the figure ``like`` is: its decimals, its thousands separator, its sign (+, −), its
    exponent (``4.281e-02``)."""
    mantissa, exponent, _ = like.partition("e")
    digits = len(mantissa.partition(".")[2])
    if exponent:
        return _plain_number(f"{value:.{digits}e}")
    text = f"{value:,.{digits}f}" if "," in like else f"{value:.{digits}f}"
    return _plain_number(text)


def _plain_number(text: str) -> str:
    text = text.replace("−", "-").lstrip("+")
    return text.lstrip("-") if float(text.replace(",", "")) == 0 else text


def plain(cell: str) -> str:
    return re.sub(r"\*\*|`", "", cell).strip()


def table(text: str, header: str) -> list[list[str]]:
    """The markdown table of ``text`` whose header row starts with ``header``: its rows of cells, header first."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table starts with {header!r}"
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows


NO_JSON = ...  # a figure with no JSON behind it (see check_table)


def check_table(rows: list[list[str]], measured: dict[str, dict], columns: dict, *, names=None, skip=()) -> int:
    """Every numeric cell of a markdown table (``rows``, header first) is its JSON row's value to the digits shown.
    ``measured``: the JSON's rows by the table's first cell (bold removed; through ``names`` where the table says
    it otherwise, a dict of labels or a function of the row's cells); ``columns``: header -> a key of the row or a
    function of it (None or NaN: a blank cell; a list: several numbers), a tuple for a cell that shows several. A
    numeric cell under any other header fails unless the header is in ``skip`` (a setting, not a measurement).
    ``NO_JSON`` (``...``) stands for a figure no JSON holds: as a value, that one figure; as a column, all of its
    figures. They are counted, not checked, and each test names them. Returns the number of figures checked."""
    import math

    header, *body = rows
    checked = 0
    for cells in body:
        label = plain(cells[0])
        row = measured[names(cells) if callable(names) else (names or {}).get(label, label)]
        for head, cell in zip(header[1:], cells[1:], strict=False):
            found = NUMBER.findall(plain(cell))
            if head in skip or columns.get(head) is NO_JSON:
                continue
            if head not in columns:
                assert not found, f"{label} / {head}: {cell!r} quotes a figure no JSON checks"
                continue
            spec = columns[head] if isinstance(columns[head], tuple) else (columns[head],)
            values = [s(row) if callable(s) else s if s is NO_JSON else row[s] for s in spec]
            values = [v for value in values for v in (value if isinstance(value, list) else [value])]
            values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
            assert len(found) == len(values), f"{label} / {head}: {cell!r} against the JSON's {values}"
            for figure, value in zip(found, values, strict=True):
                if value is NO_JSON:
                    continue
                assert shown(value, figure) == _plain_number(figure), f"{label} / {head}: {figure}, the JSON {value}"
                checked += 1
    return checked


def test_check_table_fails_on_a_changed_digit_and_an_unchecked_figure():
    rows = table("| run | loss | note |\n|---|---|---|\n| **a** | 3.10 | 2 |\n", "| run")
    measured = {"a": {"loss": 3.104}}
    assert check_table(rows, measured, {"loss": "loss"}, skip=("note",)) == 1
    with pytest.raises(AssertionError):
        check_table(rows, {"a": {"loss": 3.094}}, {"loss": "loss"}, skip=("note",))
    with pytest.raises(AssertionError, match="no JSON checks"):
        check_table(rows, measured, {"loss": "loss"})
    assert shown(1128.4, "1,128") == "1,128" and shown(-0.004, "0.00") == "0.00" and shown(-0.21, "−0.21") == "-0.21"
    assert shown(0.04281, "4.281e-02") == "4.281e-02" and NUMBER.findall("4.281e-02 / 2") == ["4.281e-02", "2"]
    # a figure no JSON holds is counted out, not checked; a whole column of them is skipped
    assert check_table(rows, measured, {"loss": lambda r: [NO_JSON], "note": NO_JSON}) == 0


FRONT = {"* and own data": (True, True), "*": (True, False), "own data": (False, True), "": (False, False)}


def test_the_readmes_frontier_excerpt_is_frontier_json():
    rows = table((ROOT / "README.md").read_text(encoding="utf-8"), "| run | gain, shared test")
    frontier = by_run("frontier.json")
    names = {plain(c[0]): plain(c[0]) for c in rows[1:]}
    names = {
        k: v.replace("local (training alone)", "local").replace(" +ft", " + fine-tuning") for k, v in names.items()
    }
    names = {k: v.replace(" + secure aggregation", " +secagg") for k, v in names.items()}
    columns = {
        "gain, shared test": "gain_loss",
        "BLEU": "bleu",
        "gain, own data": "gain_own_loss",
        "upload × FedAvg": "upload_vs_fedavg",
        "server's MIA advantage": "mia_advantage",
    }
    assert check_table(rows, frontier, columns, names=names, skip=("Pareto front (* shared test)",)) == 65
    for cells in rows[1:]:
        row = frontier[names[plain(cells[0])]]
        assert FRONT[cells[-1]] == (row["pareto"], row["pareto_own"]), cells


def test_the_readmes_frontier_prose_is_frontier_json():
    text = page("README.md")
    f = by_run("frontier.json")
    fedavg, local, two = f["fedavg"], f["local"], f["fedavg 2-bit"]
    assert f"the full table, {len(f)} rows" in text
    assert f"FedAvg reaches {fedavg['bleu']:.1f} BLEU where each client alone reaches {local['bleu']:.1f}" in text
    assert (
        f"FedAvg with 2-bit updates keeps {two['gain_loss']:.0%} of its gain for {two['upload_vs_fedavg']:.1%} of its "
        f"upload, and its server's membership advantage is {two['mia_advantage']:.2f}"
    ) in text
    tf4 = f["trustformer β=0.5 4-bit"]
    s0, s1 = tf4["gain_loss_per_seed"]
    assert (
        f"Trustformer β = 0.5 with 4-bit centroids keeps {tf4['gain_loss']:.0%} ({s0:.2f} and {s1:.2f} over the two "
        f"seeds) for {tf4['upload_vs_fedavg']:.1%}, with advantage {tf4['mia_advantage']:.2f}"
    ) in text
    down = by_run("download.json")
    assert (
        f"centroids download {tf4['download_vs_fedavg']:.2f}× at β = 0.5 "
        f"({down['trustformer β=0.5 4-bit · down 4']['download_vs_fedavg']:.2f}× at 4 bits)"
    ) in text
    both = down["fedavg 2-bit nearest · down 2"]
    each = {f"{both[k]:.3f}" for k in ("upload_vs_fedavg", "download_vs_fedavg")}
    assert len(each) == 1 and f"keeps {both['gain_loss']:.3f} of its gain for {each.pop()}× each way" in text
    tf2 = f["trustformer β=0.5 2-bit"]
    assert f"keeps {tf2['gain_loss']:.0%} for {tf2['upload_vs_fedavg']:.1%} of the upload" in text
    assert f"the server recovers {tf4['recovered']:.2%} of the weights" in text
    assert f"relative error {tf4['relative_error']:.2f} against {two['relative_error']:.2f}" in text
    floor = by_run("floor-off.json")["trustformer β=0.7 4-bit"]
    assert f"β = 0.7 4-bit keep {floor['gain_loss']:.0%} for {floor['upload_vs_fedavg']:.1%}" in text

    def spread(labels, key="mia_advantage"):
        values = [f[label][key] for label in labels]
        return f"{min(values):.2f}–{max(values):.2f}"

    trustformer = ("trustformer β=0.5", "trustformer β=0.5 4-bit", "trustformer β=0.5 2-bit")
    fedavgs = ("fedavg", "fedavg 4-bit", "fedavg 2-bit")
    assert f"attack advantage is {spread(trustformer)} against FedAvg's {spread(fedavgs)}" in text
    secagg = [f[r]["mia_advantage"] for r in ("trustformer β=0.5 +secagg", "fedavg +secagg")]
    assert f"add secure aggregation ({min(secagg):.2f} to {max(secagg):.2f})" in text
    low = f["trustformer β=0.1 4-bit + fine-tuning"]
    assert f"lower β ({low['mia_advantage']:.2f} at β = 0.1, keeping {low['gain_loss']:.0%} of the gain)" in text
    coded = ("fedavg 4-bit + fine-tuning", "fedavg 2-bit + fine-tuning")
    ups = [f[r]["upload_vs_fedavg"] for r in coded]
    assert (
        f"gains {spread(coded, 'gain_own_loss')} (more than FedAvg's own model) for {100 * min(ups):.0f}–{max(ups):.0%}"
        in text
    )
    tuned = [r for r in f if r.startswith("trustformer β=0.5") and r.endswith("+ fine-tuning")]
    assert (
        f"Trustformer β = 0.5 + fine-tuning reaches {spread(tuned, 'gain_own_loss')} "
        f"({f['trustformer β=0.5 4-bit + fine-tuning']['gain_own_loss']:.2f} with 4-bit centroids)"
    ) in text


def test_the_readmes_guarantee_and_robustness_prose_is_the_json():
    text = page("README.md")
    pays = by_run("dp-pays.json")
    public, control = pays["public model"], pays["control"]
    dp_bleu = max(r["bleu"] for r in pays.values() if r["epsilon"] and r["records_per_owner"] == 3000)
    assert public["bleu"] > dp_bleu and f"than any DP run here (BLEU {public['bleu']:.1f})" in text
    free, fedavg = public["loss"] - control["loss"], control["loss"] - pays["public + fedavg + fine-tuning"]["loss"]
    assert f"{free:.2f}" == f"{fedavg:.2f}" and f"takes {free:.2f} nats, as much as FedAvg adds" in text
    at8 = [
        r["gain_loss"]
        for k, r in pays.items()
        if k.startswith("dp ε=8") and k.endswith("+ fine-tuning") and "@" not in k
    ]
    seed1 = by_run("dp-pays-seed1.json")["dp ε=8 + fine-tuning"]["gain_loss"]
    six = "dp ε=8 distributed + fine-tuning @ 6 owners"
    once = [
        by_run(f)[six][k]
        for f in ("dp-pays-owners.json", "dp-pays-owners-seed2.json")
        for k in ("gain_loss", "gain_own_loss")
    ]
    assert (
        f"keeps {min(at8):.2f}–{max(at8):.2f} of FedAvg's gain at ε = 8 "
        f"({pays['dp ε=8 + fine-tuning']['gain_loss']:.2f} plain, {seed1:.2f} on seed 1), {min(once):.2f}–"
        f"{max(once):.2f} with 6 owners of 1,500 and the noise added once (two seeds), and nothing at ε = 1"
    ) in text
    assert pays["dp ε=1 + fine-tuning"]["gain_loss"] <= 0
    assert f"ε = 8 at ε_lb = {bench('audit-ui-e8.json')['epsilon_lb']:.2f}" in text
    public = bench("robustness-public.json")["rows"]
    plain = [x for x in public if x["adapters"] == "none" and not (x.get("attack_rounds") or x.get("trigger"))]
    r = {(x["malicious"], x["defence"], x["fault"]): x for x in plain}
    replace = r[1, "none", "backdoor_replace"]["backdoor_success"]
    assert f"makes {replace:.0%} of triggered test" in text
    bound, honest = r[1, "default", "backdoor_replace"], r[1, "default", "honest"]
    assert bound["backdoor_success"] == 0 and bound["events_malicious"]["refused"] == bound["rounds"]
    assert f"(0.000 nats, {honest['defence_share']:.1%} of the round's time)" in text
    assert f"{honest['cost_loss']:.3f}" == "0.000"
    others = [r[1, d, "honest"]["cost_loss"] for d in ("median", "multikrum", "fltrust", "flame", "clip_noise")]
    assert f"cost honest owners +{min(others):.2f} to +{max(others):.2f} more" in text
    assert f"boost's damage (+{r[1, 'rlr+secagg', 'backdoor_replace']['vs_defended_honest']:.2f})" in text
    tee = r[1, "default+tee", "backdoor_replace"], r[1, "default+tee", "honest"]
    assert (tee[0]["test_loss"], tee[1]["test_loss"]) == (bound["test_loss"], honest["test_loss"])
    assert tee[0]["backdoor_success"] == 0 and "inside the attested aggregator, same figures" in text


def _block(text: str, first_line: str) -> str:
    """The fenced block of ``text`` whose first line starts with ``first_line``, without its fences."""
    start = text.index("\n" + first_line) + 1
    return text[start : text.index("\n```", start)]


def test_the_benchmarks_frontier_is_rendered_from_frontier_json():
    """docs/benchmarks.md prints the frontier as `bench federation` prints it: the same table, from the JSON."""
    from trustformer_lab.bench.federation_table import format_table

    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    rows = bench("frontier.json")["rows"]
    assert _block(text, "run ") == format_table(rows), "rerender it: format_table(frontier.json's rows)"
    f = by_run("frontier.json")
    s0, s1 = f["fedavg"]["bleu_per_seed"]
    assert (
        f"FedAvg reaches BLEU {f['fedavg']['bleu']:.1f} there ({s0:.1f} and {s1:.1f} over seeds 0 and 1), "
        f"training alone {f['local']['bleu']:.1f}"
    ) in page("benchmarks.md")


def test_the_benchmarks_public_start_table_and_prose_are_public_json():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    public = by_run("public.json")
    columns = {
        "test loss": "loss",
        "BLEU": "bleu",
        "own loss": "own_loss",
        "own BLEU": "own_bleu",
        "gain (scratch refs)": "gain_loss",
        "own gain (scratch refs)": "gain_own_loss",
        "gain (public refs)": "pgain_loss",
        "own gain (public refs)": "pgain_own_loss",
        "up × FedAvg": "upload_vs_fedavg",
        "down × FedAvg": "download_vs_fedavg",
        "MIA advantage": "mia_advantage",
    }
    assert (
        check_table(table(text, "| run | test loss | BLEU | own loss | own BLEU | gain (scratch"), public, columns)
        == 132
    )
    prose = page("benchmarks.md")
    alone, fedavg, both, local = public["public model"], public["fedavg"], public["public + fedavg"], public["local"]
    assert f"The public model alone scores test loss {alone['loss']:.3f} and BLEU {alone['bleu']:.2f}" in prose
    assert (
        f"{both['loss']:.3f} against {fedavg['loss']:.3f} (gain {both['gain_loss']:.2f} on the from-scratch scale, "
        f"{both['gain_own_loss']:.2f} on own data). Its BLEU is {both['bleu']:.1f} against {fedavg['bleu']:.1f}"
    ) in prose
    advantage = f"rises from {fedavg['mia_advantage']:.2f} to {both['mia_advantage']:.2f}"
    assert advantage in prose and f"(BLEU {alone['bleu']:.1f} against {local['bleu']:.1f})" in prose
    lora16, lora4 = public["public + fedavg lora r16 4-bit"], public["public + fedavg lora r4 4-bit"]
    assert (
        f"{lora16['upload_vs_fedavg']:.4f}× FedAvg's upload at rank 16 with 4-bit coding, "
        f"{lora4['upload_vs_fedavg']:.4f}× at rank 4. They keep {lora16['gain_loss']:.2f} (rank 16) and "
        f"{lora4['gain_loss']:.2f} (rank 4) of from-scratch FedAvg's gain, and {lora16['pgain_loss']:.2f} and "
        f"{lora4['pgain_loss']:.2f} of public + FedAvg's"
    ) in prose
    tf = public["public + trustformer β=0.5"]
    assert (
        f"public + Trustformer β = 0.5 keeps {tf['gain_loss']:.2f} of the from-scratch gain and "
        f"{tf['pgain_loss']:.2f} of public + FedAvg's, with own gain {tf['gain_own_loss']:.2f}"
    ) in prose


def test_the_benchmarks_download_table_and_prose_are_download_json():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    down = by_run("download.json")
    fedavg = down["fedavg"]

    def total(r):
        return [r["total_bytes"] / fedavg["total_bytes"]] + ([r["total_bytes"] / 1e6] if r is fedavg else [])

    def to_target(r):
        reached = r.get("bytes_to_target")
        return [] if reached is None else [reached / 1e6, reached / fedavg["bytes_to_target"]]

    columns = {
        "seeds": lambda r: len(r["seeds"]),
        "test loss": "loss",
        "gain (per seed)": lambda r: r["gain_loss_per_seed"],
        "BLEU": "bleu",
        "up × FedAvg": "upload_vs_fedavg",
        "down × FedAvg": "download_vs_fedavg",
        "total bytes × FedAvg": total,
        "bytes to 90% of FedAvg's gain": to_target,
        "server ms / round (coding)": (
            lambda r: 1000 * r["server_s_per_round"],
            lambda r: 1000 * r["download_code_s_per_round"],
        ),
    }
    assert check_table(table(text, "| run | seeds | test loss | gain (per seed)"), down, columns) == 150
    prose = page("benchmarks.md")
    two = down["fedavg 2-bit · down 2"]["gain_loss_per_seed"]
    assert f"keeps {two[0]:.3f} and {two[1]:.3f} of the gain over the two seeds" in prose
    both = down["fedavg 2-bit nearest · down 2"]
    g0, g1 = both["gain_loss_per_seed"]
    assert f"keeps {g0:.3f} and {g1:.3f} of the gain (mean {both['gain_loss']:.3f})" in prose
    reached, full = both["bytes_to_target"], fedavg["bytes_to_target"]
    assert f"after {reached / 1e6:.1f} MB in all: {reached / full:.3f}× of FedAvg's {full / 1e6:.0f} MB" in prose
    ui = down["public-ui + fedavg lora r16 4-bit · down 4"]
    u0, u1 = ui["gain_loss_per_seed"]
    b0, b1 = ui["bleu_per_seed"]
    assert (
        f"ends at gain {u0:.3f} and {u1:.3f} over the two seeds for {ui['upload_vs_fedavg']:.4f}× up and "
        f"{ui['download_vs_fedavg']:.3f}× down, BLEU {b0:.1f} and {b1:.1f}"
    ) in prose
    alone = next(r for r in bench("finetune-ui-dedup-e8.json")["rows"] if r["start"] == "public" and not r["epochs"])
    local, scratch = (down[r]["loss_per_seed"][0] for r in ("local", "fedavg"))
    gain = (local - alone["test_loss"]) / (local - scratch)
    loss, bleu = alone["test_loss"], alone["test_bleu"]
    assert f"public model alone is at test loss {loss:.3f} (gain {gain:.2f}) and BLEU {bleu:.1f}" in prose


def _dp_pays_gain(key: str):
    """A dp-pays row's share of FedAvg's gain, shown for the control and the fine-tuned rows only."""
    return lambda r: r[key] if r["run"] == "control" or r["run"].endswith("fine-tuning") else None


DP_PAYS_COLUMNS = {
    "test loss": "loss",
    "own loss": "own_loss",
    "BLEU": "bleu",
    "gain (test)": _dp_pays_gain("gain_loss"),
    "gain (own)": _dp_pays_gain("gain_own_loss"),
}


def test_the_dp_pays_table_of_privacy_md_is_dp_pays_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    pays = by_run("dp-pays.json")
    keys = iter(
        [
            "public model",
            "control",
            "public + fedavg",
            "public + fedavg + fine-tuning",
            "dp ε=8",
            "dp ε=8 + fine-tuning",
            "dp ε=8 + fedadam",
            "dp ε=8 + fedadam + fine-tuning",
            "dp ε=8 distributed",
            "dp ε=8 distributed + fine-tuning",
            "dp ε=8 distributed b=8",
            "dp ε=8 distributed b=8 + fine-tuning",
            "dp ε=1",
            "dp ε=1 + fine-tuning",
        ]
    )

    columns = {"ε": "epsilon", **DP_PAYS_COLUMNS}
    rows = table(text, "| run (3,000 pairs per owner) |")
    assert check_table(rows, pays, columns, names=lambda cells: next(keys)) == 66


def test_the_subspace_and_owners_tables_of_privacy_md_are_their_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")

    columns = {**DP_PAYS_COLUMNS, "wall s": "wall_s"}
    subspace = table(text, "| row | test loss | own loss | BLEU | gain (test) |")
    assert check_table(subspace, by_run("dp-pays-subspace-seed1.json"), columns) == 42
    owners = table(text, "| row | test loss | own loss | BLEU | wall s |")
    local = "dp ε=8 + fine-tuning @ 6 owners"
    banded = "dp ε=8 distributed b=8 + fine-tuning @ 6 owners"
    names = {
        f"{local} (local noise: the recipe, 2 threads)": local,
        f"{banded} (the noise banded over 8 rounds)": banded,
    }
    assert check_table(owners, by_run("dp-pays-owners.json"), columns, names=names) == 32
    second = table(text, "| row (seed 2) | test loss | own loss | BLEU | share (test) |")
    shares = {**columns, "share (test)": "gain_loss", "share (own)": "gain_own_loss"}
    assert check_table(second, by_run("dp-pays-owners-seed2.json"), shares, names=names) == 30


def test_the_robustness_table_is_the_bench_json():
    text = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    measured = {}
    for name, protocol in (("robustness-fedavg.json", "FedAvg"), ("robustness-trustformer.json", "Trustformer β=0.5")):
        measured.update({(protocol, r["defence"], r["fault"]): r for r in bench(name)["rows"]})
    absent = measured["FedAvg", "none", "absent"]["test_loss"]

    def key(cells):
        return plain(cells[0]), plain(cells[1]), plain(cells[2]).split(" ")[0]

    def vs_absent(r):
        shows = r["strategy"] == "fedavg" and r["fault"] in ("absent", "scale", "sign_flip", "noise")
        return r["test_loss"] - absent if shows else None

    def events(r):
        return None if r["fault"] == "absent" else [r["events"]["clipped"], r["events"]["refused"]]

    columns = {
        "test loss": "test_loss",
        "Δ vs honest": "loss_change",
        "Δ vs absent": vs_absent,
        "BLEU": "bleu",
        "backdoor success": lambda r: 100 * r["backdoor_success"],
        "clipped / refused": events,
    }
    rows = table(text, "| protocol | defence | fault | test loss | Δ vs honest | Δ vs absent")
    assert check_table(rows, measured, columns, names=key, skip=("defence", "fault")) > 120


def test_the_benchmarks_record_dp_fedprox_and_floor_tables_are_their_json():
    from trustformer_lab.bench.federation_table import format_table

    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    common = {"loss": "loss", "test loss": "loss", "BLEU": "bleu", "own loss": "own_loss", "gain": "gain_loss"}
    record = {
        **common,
        "ε": "epsilon",
        "gBLEU": "gain_bleu",
        "g own": "gain_own_loss",
        "up": "upload_vs_fedavg",
        "MIA": "mia_advantage",
        "TPR1%": "mia_tpr_1pct",
        "ε_lb": "epsilon_lb",
    }
    assert check_table(table(text, "| run | ε | loss | BLEU | own loss"), by_run("record-dp.json"), record) == 71
    prox = {
        **common,
        "gain (BLEU)": "gain_bleu",
        "up / FedAvg": "upload_vs_fedavg",
        "server's advantage": "mia_advantage",
        "TPR@1%": "mia_tpr_1pct",
    }
    names = {f"fedprox μ = {mu}": f"fedprox μ={mu}" for mu in ("0.001", "0.01", "0.1")}
    rows = table(text, "| run | test loss | BLEU | own loss | gain | gain (BLEU) | up / FedAvg")
    assert check_table(rows, by_run("fedprox.json"), prox, names=names) == 40
    floor = by_run("floor-off.json")
    assert _block(text, "run ").count("\n") > 40  # the frontier's block comes first; the floor's is the next one
    second = text.index("\n```text\nrun ", text.index("### Beyond the privacy floor"))
    assert _block(text[second:], "run ") == format_table(bench("floor-off.json")["rows"])
    tf, tuned = floor["trustformer β=0.7 4-bit"], floor["trustformer β=0.7 4-bit + fine-tuning"]
    assert (
        f"Trustformer keeps {tf['gain_loss']:.2f}/{tf['gain_bleu']:.2f} of the gain (BLEU {tf['bleu']:.1f}) for "
        f"{tf['upload_vs_fedavg']:.3f}× the upload and {tf['download_vs_fedavg']:.2f}× the download"
    ) in page("benchmarks.md")
    assert tuned["upload_vs_fedavg"] == tf["upload_vs_fedavg"]
    assert (
        f"recovers {tf['recovered']:.1%} of the weights exactly and estimates the rest with a relative error of "
        f"{tf['relative_error']:.3f} ({by_run('frontier.json')['trustformer β=0.5']['relative_error']:.3f} under the "
        f"floor). Its membership advantage does not change ({tf['mia_advantage']:.2f})"
    ) in page("benchmarks.md")


def test_the_dp_pays_prose_of_privacy_md_is_the_json():
    text = page("privacy.md")
    pays, seed1 = by_run("dp-pays.json"), by_run("dp-pays-seed1.json")
    assert (
        f"test loss {pays['public model']['loss']:.3f}, BLEU {pays['public model']['bleu']:.1f}), the benchmark's"
        in text
    )
    public, control, fedavg = seed1["public model"], seed1["control"], seed1["public + fedavg + fine-tuning"]
    dp, tuned = seed1["dp ε=8"], seed1["dp ε=8 + fine-tuning"]
    assert f"test loss {public['loss']:.3f}, BLEU {public['bleu']:.1f}). Control {control['loss']:.3f} / " in text
    assert (
        f"Control {control['loss']:.3f} / {control['own_loss']:.3f} (test / own loss), public + FedAvg + fine-tuning "
        f"{fedavg['loss']:.3f} / {fedavg['own_loss']:.3f}, DP ε = 8 (local noise) {dp['loss']:.3f} / "
        f"{dp['own_loss']:.3f} and BLEU {dp['bleu']:.1f} before fine-tuning, {tuned['loss']:.3f} / "
        f"{tuned['own_loss']:.3f} after"
    ) in text
    s0 = pays["dp ε=8 + fine-tuning"]
    shares = {f"{tuned[k]:.2f}" for k in ("gain_loss", "gain_own_loss")}
    assert len(shares) == 1 and f"**{shares.pop()} of FedAvg's gain on both**" in text
    assert f"against seed 0's {s0['gain_loss']:.2f} and {s0['gain_own_loss']:.2f}" in text
    test, own = ((s0[k] + tuned[k]) / 2 for k in ("gain_loss", "gain_own_loss"))
    assert f"Mean of the two seeds: {test:.3f} on the test set and {own:.3f} on own data" in text


# ------------------------------------------------------------------------------------------- privacy.md
# Figures these tests cannot check, because no JSON holds them (measured by hand, or written to runs/ only): the
# secure-exchange cost table, the reconstruction table (attack.json), the client-level and per-step audit plants and
# the honest-runs audit table (scripts/*_plants.py, `attack audit --seeds 20`), the per-owner losses and chrF of
# the training-alone and FedAvg references, and the other NO_JSON cells named below.


def starts(labels: dict):
    """``names`` for check_table: the table's first cell (bold and code removed) by the longest key it starts with."""

    def name(cells):
        label = plain(cells[0])
        found = [key for key in labels if label.startswith(key)]
        assert found, f"{label!r} names no JSON row"
        return labels[max(found, key=len)]

    return name


def gap_closed(loss: float, refs: tuple[float, float]) -> float:
    """The share of the gap from ``refs[0]`` (training alone, 0) to ``refs[1]`` (FedAvg, 1) that ``loss`` closes."""
    return (refs[0] - loss) / (refs[0] - refs[1])


def finetuned(name: str, start: str, epochs: int) -> dict:
    """The row of a `bench finetune` JSON for one start (`run` or `public`) and number of epochs."""
    return next(r for r in bench(name)["rows"] if r["start"] == start and r["epochs"] == epochs)


def test_the_dp_recipe_tables_of_privacy_md_are_their_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    five, lever = by_run("dp-recipe.json"), "public + lora r16 dp ε=8 "
    names = {
        "baseline": "baseline",
        "B = full": "B=full",
        "lr×4:": "lr×4",
        "adam-bc": "adam-bc",
        "ffa": "ffa",
        "distributed": "distributed",
        "lr×4 + B = full": "lr×4+B=full",
    }
    names = {k: lever + v for k, v in names.items()} | {
        "public + training alone": "public + local",
        "public + FedAvg": "public + fedavg",
    }
    columns = {
        "test loss": "loss",
        "BLEU": "bleu",
        "gap closed": "pgain_loss",
        "own, free FT": lambda r: five[r["run"] + " + fine-tuning"]["own_loss"],
        "up bytes / owner / round": lambda r: r["up_bytes"] / 1000,
        "wall s": "wall_s",
    }
    assert check_table(table(text, "| row (ε = 8) |"), five, columns, names=starts(names)) == 54
    alone = finetuned("finetune-e8-bleu.json", "public", 0)  # the public model the recipe rows start from
    assert f"The public model alone: test loss {alone['test_loss']:.3f}, BLEU {alone['test_bleu']:.1f}." in prose
    base, lr4, adam = (five[lever + k] for k in ("baseline", "lr×4", "adam-bc"))
    assert f"{base['loss'] - lr4['loss']:.2f} nats below the baseline" in prose
    assert f"reaches the same loss but loses {lr4['bleu'] - adam['bleu']:.1f} BLEU" in prose
    plain_rows = [five[r]["bleu"] for r in ("public + local", "public + fedavg")]
    assert f"the non-DP rows fall to {min(plain_rows):.1f}–{max(plain_rows):.1f} after 5 rounds" in prose
    tuned = five[lever + "lr×4 + fine-tuning"]["own_loss"]
    assert f"({lr4['own_loss']:.2f} → {tuned:.2f} for lr×4)" in prose
    assert f"training alone has had ({five['public + local + fine-tuning']['own_loss']:.2f})" in prose

    # carried to 10 rounds (dp-recipe-10.json), beside record-dp.json's B = 256 row and distributed noise's row,
    # both on record-dp.json's references (public.json's public + local and public + fedavg)
    ten = by_run("dp-recipe-10.json")
    refs = tuple(by_run("public.json")[r]["loss"] for r in ("public + local", "public + fedavg"))
    record = by_run("record-dp.json")
    old, spread = record["public + fedavg lora r16 dp ε=8"], by_run("distributed-dp-small.json", "epsilon_target")[8]

    def bench_row(r, tuned=None, gap=None):
        gap = r.get("pgain_loss") if gap is None else gap
        return {"loss": r["loss"], "bleu": r["bleu"], "gap": gap, "own": r["own_loss"], "ft": tuned}

    rows = {
        "public model alone": {"loss": alone["test_loss"], "bleu": alone["test_bleu"]},
        "public + training alone": bench_row(ten["public + local"], ten["public + local + fine-tuning"]["own_loss"]),
        "public + FedAvg": bench_row(ten["public + fedavg"], ten["public + fedavg + fine-tuning"]["own_loss"]),
        "public + LoRA r16, DP ε = 8, B = 256": bench_row(
            old, record["public + fedavg lora r16 dp ε=8 + fine-tuning"]["own_loss"], gap_closed(old["loss"], refs)
        ),
        "public + LoRA r16, DP ε = 8, B = 1,024": bench_row(
            ten[lever + "lr×4"], ten[lever + "lr×4 + fine-tuning"]["own_loss"]
        ),
        "public + LoRA r16, distributed noise": {
            "loss": spread["test_loss"],
            "bleu": spread["bleu"],
            "gap": gap_closed(spread["test_loss"], refs),
            "own": sum(spread["own_test_loss"]) / 3,
        },
    }
    columns = {"test loss": "loss", "BLEU": "bleu", "gap closed": "gap", "own loss": "own", "own, free FT": "ft"}
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    rows_ten = table(text, "| row | test loss | BLEU | gap closed | own loss | own, free FT |")
    assert all(f"refs {refs[0]:.3f} / {refs[1]:.3f}" in cells[0] for cells in rows_ten[4:7:2])
    assert check_table(rows_ten, rows, columns, names=starts({k: k for k in rows})) == 26
    assert (
        f"from {rows['public + LoRA r16, DP ε = 8, B = 256']['gap']:.2f} to "
        f"{rows['public + LoRA r16, DP ε = 8, B = 1,024']['gap']:.2f}, and distributed noise to "
        f"{rows['public + LoRA r16, distributed noise']['gap']:.2f}"
    ) in prose
    assert f"({ten[lever + 'lr×4']['bleu']:.1f} against {alone['test_bleu']:.1f})" in prose
    assert f"as it does for public + training alone ({ten['public + local']['bleu']:.1f})" in prose

    # ε = 1, 3 and 8 (dp-recipe-eps.json), before and after the free fine-tuning
    eps = by_run("dp-recipe-eps.json")
    names = {e: f"public + lora r16 dp ε={e} recipe" for e in ("1", "3", "8")}
    names |= {"public + training alone": "public + local", "public + FedAvg": "public + fedavg"}

    def after(r):
        ft = eps[r["run"] + " + fine-tuning"]
        return [ft["loss"], ft["bleu"], ft["pgain_loss"], ft["own_loss"]]

    columns = {
        "test loss": "loss",
        "BLEU": "bleu",
        "gap closed": "pgain_loss",
        "own loss": "own_loss",
        "after free fine-tuning: test loss / BLEU / gap closed / own loss": after,
    }
    assert check_table(table(text, "| ε | test loss | BLEU | gap closed |"), eps, columns, names=starts(names)) == 40
    e8, e8ft, e1ft = eps[names["8"]], eps[names["8"] + " + fine-tuning"], eps[names["1"] + " + fine-tuning"]
    assert f"({e8['loss']:.3f} against {ten[lever + 'lr×4']['loss']:.3f}: the noise differs" in prose
    assert f"(gap {e8['pgain_loss']:.2f} → {e8ft['pgain_loss']:.2f})" in prose
    ft4 = ten[lever + "lr×4 + fine-tuning"]["own_loss"]
    assert f"({e8ft['own_loss']:.3f} against {ft4:.3f})" in prose
    assert f"on the owner's own data ({ten['public + local']['own_loss']:.3f})" in prose
    assert f"ε = 1 closes nothing before fine-tuning, {e1ft['pgain_loss']:.2f} after" in prose


def test_the_fine_tuning_and_ui_catalog_tables_of_privacy_md_are_their_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    ten, eps = by_run("dp-recipe-10.json"), by_run("dp-recipe-eps.json")
    refs = ten["public + local"]["loss"], ten["public + fedavg"]["loss"]

    def tuned(start, epochs):  # finetune-e8.json, with the test BLEU of finetune-e8-bleu.json where it was scored
        r = finetuned("finetune-e8.json", start, epochs)
        scored = [b for b in bench("finetune-e8-bleu.json")["rows"] if (b["start"], b["epochs"]) == (start, epochs)]
        bleu = scored[0]["test_bleu"] if scored else None
        return {**r, "loss": r["test_loss"], "bleu": bleu, "gap": gap_closed(r["test_loss"], refs)}

    def reference(r):
        return {**r, "gap": r["pgain_loss"]}

    adapters = eps["public + lora r16 dp ε=8 recipe + fine-tuning"]
    measured = {
        ("DP ε = 8 run (recipe)", "none"): tuned("run", 0),
        ("DP ε = 8 run", "adapters only, 1 × 0.1 (the rows above)"): reference(adapters),
        ("DP ε = 8 run", "every weight, 2 × 0.25"): tuned("run", 2),
        ("DP ε = 8 run", "every weight, 4 × 0.25"): tuned("run", 4),
        ("public model alone (the control)", "every weight, 2 × 0.25"): tuned("public", 2),
        ("public model alone", "every weight, 4 × 0.25"): tuned("public", 4),
        ("public + training alone (10 epochs, cosine at train.lr)", "none"): reference(ten["public + local"]),
        ("public + FedAvg (no DP)", "none"): reference(ten["public + fedavg"]),
    }
    columns = {
        "own loss": "own_loss",
        "own BLEU": "own_bleu",
        "shared test loss": "loss",
        "test BLEU": "bleu",
        "gap closed": "gap",
    }
    rows = table(text, "| start | fine-tuning (epochs × rate) |")
    # the ε = 1 row ran before `bench finetune` existed: no JSON holds it
    no_json = [cells for cells in rows if cells[0].startswith("DP ε = 1")]
    rows = [cells for cells in rows if cells not in no_json]
    assert len(no_json) == 1
    checked = check_table(
        rows, measured, columns, names=lambda c: (plain(c[0]), plain(c[1])), skip=("fine-tuning (epochs × rate)",)
    )
    assert checked == 38
    run2, public2, run4 = tuned("run", 2), tuned("public", 2), tuned("run", 4)
    assert f"at once ({tuned('run', 0)['bleu']:.1f} → {run2['bleu']:.1f})" in prose
    assert f"at ε = 8 ({' / '.join(f'{x:.3f}' for x in run2['own_loss_per_owner'])} against" in prose
    alone = ten["public + local"]
    own_bleu = f"Own-data BLEU does not follow: {run2['own_bleu']:.1f} against training alone's"
    assert f"{own_bleu} {alone['own_bleu']:.1f}" in prose
    assert f"4 epochs at 0.25 get {run4['own_bleu']:.1f}" in prose
    assert (
        f"({public2['loss']:.3f} against {run2['loss']:.3f}; own {public2['own_loss']:.3f} against "
        f"{run2['own_loss']:.3f})"
    ) in prose
    assert f"shared test loss {alone['loss']:.3f}), and a gentle" in prose
    assert f"So the {run2['gap']:.2f} of the gap is not federation's doing" in prose

    # the public start with Debian's UI catalogs (dp-recipe-ui-e8.json; the DP run's and the public model's chrF and
    # per-owner losses from finetune-ui-e8.json, which fine-tuned the same saved model)
    ui = by_run("dp-recipe-ui-e8.json")
    dp, dp_ft = ui["public + lora r16 dp ε=8 recipe"], ui["public + lora r16 dp ε=8 recipe + fine-tuning"]
    public0, run0, run1 = (finetuned("finetune-ui-e8.json", s, e) for s, e in (("public", 0), ("run", 0), ("run", 1)))
    control = finetuned("finetune-ui-e8.json", "public", 1)
    assert abs(run0["test_loss"] - dp["loss"]) < 1e-6 and abs(run0["own_loss"] - dp["own_loss"]) < 1e-6

    def after(r, owners=()):
        ft = ui[r["run"] + " + fine-tuning"]
        return [ft["loss"], ft["bleu"], ft["pgain_loss"], ft["own_loss"], *owners]

    measured = {
        "public model (UI catalogs) alone": {
            "loss": public0["test_loss"],
            "bleu": public0["test_bleu"],
            "chrf": public0["test_chrf"],
        },
        "public + training alone": {
            **ui["public + local"],
            "chrf": NO_JSON,
            "own": [ui["public + local"]["own_loss"], NO_JSON, NO_JSON, NO_JSON],
            "after": after(ui["public + local"]),
        },
        "public + FedAvg": {
            **ui["public + fedavg"],
            "chrf": NO_JSON,
            "own": [ui["public + fedavg"]["own_loss"]],
            "after": after(ui["public + fedavg"]),
        },
        "public + LoRA r16, DP ε = 8": {
            **dp,
            "chrf": run0["test_chrf"],
            "own": [dp["own_loss"], *run0["own_loss_per_owner"]],
            "after": after(dp, run1["own_loss_per_owner"]),
        },
    }
    columns = {
        "test loss": "loss",
        "BLEU": "bleu",
        "chrF": "chrf",
        "gap closed": "pgain_loss",
        "own loss (per owner)": "own",
        "own BLEU": "own_bleu",
        "after free fine-tuning: test / BLEU / gap / own": "after",
    }
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    rows = table(text, "| run | test loss | BLEU | chrF | gap closed |")
    assert check_table(rows, measured, columns, names=starts({k: k for k in measured})) == 37
    fedavg = ui["public + fedavg"]
    assert (
        f"Bytes: {dp['up_bytes'] / 1000:.0f} k up and {dp['down_bytes'] / 1000:.0f} k down per owner per round "
        f"({dp['upload_vs_fedavg']:.3f}× FedAvg's)"
    ) in prose
    assert f"ε = {dp['epsilon']:.3f} per owner" in prose
    assert f"{dp['pgain_loss']:.2f} of the gap ({dp_ft['pgain_loss']:.2f} after the free fine-tuning)" in prose
    assert f"on loss ({dp['loss']:.3f} against {public0['test_loss']:.3f})" in prose
    public_gap = gap_closed(public0["test_loss"], (ui["public + local"]["loss"], fedavg["loss"]))
    assert f"The UI-catalog model alone closes {public_gap:.2f} of this gap" in prose
    control_gap = gap_closed(control["test_loss"], (ui["public + local"]["loss"], fedavg["loss"]))
    owners = " / ".join(f"{x:.3f}" for x in control["own_loss_per_owner"])
    assert (
        f"ends at test loss {control['test_loss']:.3f}, BLEU {control['test_bleu']:.1f}, gap {control_gap:.2f} "
        f"and own loss {control['own_loss']:.3f} ({owners}): {control['test_loss'] - dp_ft['loss']:.3f} and "
        f"{control['own_loss'] - dp_ft['own_loss']:.3f} nats from the federation's {dp_ft['loss']:.3f} and "
        f"{dp_ft['own_loss']:.3f}"
    ) in prose
    assert (
        f"adds over the public start is {dp['pgain_loss'] - public_gap:.2f} of the gap before fine-tuning and about "
        f"{dp_ft['pgain_loss'] - control_gap:.2f} after"
    ) in prose
    assert (
        f"BLEU {dp['bleu']:.1f} is below the public model's own {public0['test_bleu']:.1f} and "
        f"{fedavg['bleu'] - dp['bleu']:.1f} below public + FedAvg's {fedavg['bleu']:.1f}; fine-tuning lowers it "
        f"further ({dp_ft['bleu']:.1f}). Own-data BLEU ({dp['own_bleu']:.1f}) is far below training alone's "
        f"({ui['public + local']['own_bleu']:.1f})"
    ) in prose


def test_the_attacked_ui_catalog_table_of_privacy_md_is_its_json():
    """dp-recipe-ui-attacked.json's rows; the public model, the control and the ε = 8 run's chrF and per-owner losses
    from finetune-ui-dedup-e8.json (the same fine-tuning of the same saved models); the one-run audit's ε_lb from
    audit-ui-e8.json; the gap on dp-recipe-ui-e8.json's references. No JSON holds the ε = 1 rows' chrF and per-owner
    losses, the public model's advantage, nor LiRA's at ε = 8."""
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    attacked, ui, audit = (
        by_run("dp-recipe-ui-attacked.json"),
        by_run("dp-recipe-ui-e8.json"),
        bench("audit-ui-e8.json"),
    )
    refs = ui["public + local"]["loss"], ui["public + fedavg"]["loss"]
    public, control = (finetuned("finetune-ui-dedup-e8.json", "public", e) for e in (0, 1))
    run0, run1 = (finetuned("finetune-ui-dedup-e8.json", "run", e) for e in (0, 1))

    def tuned(r, owners=None):  # a `bench finetune` row
        owners = r["own_loss_per_owner"] if owners is None else owners
        loss = r["test_loss"]
        return {
            "loss": loss,
            "bleu": r["test_bleu"],
            "chrf": r["test_chrf"],
            "gap": gap_closed(loss, refs),
            "own": [r["own_loss"], *owners],
        }

    def run(label, chrf=NO_JSON, owners=(NO_JSON,) * 3, advantage=None, lb=None):
        r = attacked[label]
        own = [r["own_loss"], *owners]
        return {**r, "chrf": chrf, "gap": gap_closed(r["loss"], refs), "own": own, "advantage": advantage, "lb": lb}

    dp1, dp8 = attacked["public-ui + lora r16 dp ε=1"], attacked["public-ui + lora r16 dp ε=8"]
    fedavg = attacked["fedavg"]
    measured = {
        ("public model alone", "—"): {**tuned(public), "advantage": [NO_JSON]},
        ("public + training alone (above)", "—"): {
            **ui["public + local"],
            "chrf": NO_JSON,
            "gap": ui["public + local"]["pgain_loss"],
            "own": [ui["public + local"]["own_loss"], NO_JSON, NO_JSON, NO_JSON],
        },
        ("from-scratch FedAvg, no DP (rerun here)", "—"): {
            **fedavg,
            "gap": None,
            "own": fedavg["own_loss"],
            "advantage": [fedavg["mia_advantage"], 100 * fedavg["mia_tpr_1pct"]],
        },
        ("public + LoRA r16, DP", "1"): run(
            "public-ui + lora r16 dp ε=1",
            advantage=[dp1["mia_advantage"], dp1["mia_tpr_1pct"]],
            lb=[dp1["epsilon_lb"]],
        ),
        ("the same + free fine-tuning", "1"): run("public-ui + lora r16 dp ε=1 + fine-tuning"),
        ("public + LoRA r16, DP", "8"): run(
            "public-ui + lora r16 dp ε=8",
            chrf=run0["test_chrf"],
            owners=run0["own_loss_per_owner"],
            advantage=[dp8["mia_advantage"], *(x - 0.5 for x in dp8["mia_ci95"]), NO_JSON],
            lb=[dp8["epsilon_lb"], audit["epsilon_lb"]],
        ),
        ("the same + free fine-tuning", "8"): run(
            "public-ui + lora r16 dp ε=8 + fine-tuning", chrf=run1["test_chrf"], owners=run1["own_loss_per_owner"]
        ),
        ("control: public model alone + the same fine-tuning", "—"): tuned(control),
    }
    columns = {
        "ε": "epsilon",
        "test loss": "loss",
        "BLEU": "bleu",
        "chrF": "chrf",
        "gap": "gap",
        "own loss (per owner)": "own",
        "server's best advantage (score; LiRA)": "advantage",
        "ε_lb (ROC; one run)": "lb",
    }
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    rows = table(text, "| run | ε | test loss | BLEU | chrF | gap | own loss (per owner) |")
    rows = [[re.sub(r" at 1%(?: FPR)?|95% CI ", "", cell) for cell in cells] for cells in rows]
    assert check_table(rows, measured, columns, names=lambda c: (plain(c[0]), plain(c[1]))) == 61
    assert (
        f"the one-run audit, {audit['canaries']:,} canaries, {audit['correct']:,} of {audit['guesses']:,} guesses "
        f"right, took {audit['wall_s'] / 60:.0f} min"
    ) in prose
    assert f"AUC {0.5 + dp8['mia_advantage']:.2f}, TPR {100 * dp8['mia_tpr_1pct']:.1f}% at 1% FPR" in prose
    assert f"at ε = 1 it is {dp1['mia_advantage']:.3f}. Without DP, from-scratch FedAvg gives " in prose
    assert f"from-scratch FedAvg gives {fedavg['mia_advantage']:.3f}." in prose

    def minus(x, digits):
        return f"{x:.{digits}f}".replace("-", "−")

    over = [gap_closed(d["loss"], refs) - gap_closed(public["test_loss"], refs) for d in (dp1, dp8)]
    bleu = [d["bleu"] - public["test_bleu"] for d in (dp1, dp8)]
    tuned_rows = [attacked[f"public-ui + lora r16 dp ε={e} + fine-tuning"] for e in (1, 8)]
    test = max(abs(t["loss"] - control["test_loss"]) for t in tuned_rows)
    own = [t["own_loss"] - control["own_loss"] for t in tuned_rows]
    assert (
        f"over the public model ({over[0]:.2f} and {over[1]:.2f}) and lose BLEU ({minus(bleu[0], 1)} and "
        f"{minus(bleu[1], 1)}), and after the free fine-tuning they end within {test:.3f} nats of the control on the "
        f"test set and {minus(own[0], 3)} and {minus(own[1], 3)} on own data"
    ) in prose


def test_the_records_per_owner_table_and_dp_pays_prose_of_privacy_md_are_dp_pays_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    pays, curve = by_run("dp-pays.json"), bench("dp-pays.json")["curve"]
    measured = {}
    for records, suffix in ((1000, " @ 1000/owner"), (3000, ""), (4584, " @ all/owner")):
        points = {
            k: next((p for p in c["points"] if p["records_per_owner"] == records), None) for k, c in curve.items()
        }
        e8, e1 = points["dp ε=8 + fine-tuning"], points["dp ε=1 + fine-tuning"]
        measured[records] = {
            "control": pays["control" + suffix]["loss"],
            "fedavg": pays["public + fedavg + fine-tuning" + suffix]["loss"],
            "fedavg_gain": e8["fedavg_gain_nats"],
            "dp8": pays["dp ε=8 + fine-tuning" + suffix]["loss"],
            "dp8_gain": e8["gain_nats"],
            "share": e8["share"],
            "dp1": e1 and pays["dp ε=1 + fine-tuning" + suffix]["loss"],
            "dp1_gain": e1 and e1["gain_nats"],
        }
    columns = {
        "control": "control",
        "public + FedAvg + ft": "fedavg",
        "FedAvg's gain": "fedavg_gain",
        "DP ε = 8 + ft (local noise)": "dp8",
        "its gain": "dp8_gain",
        "share": "share",
        "DP ε = 1 + ft": "dp1",
        "its gain (ε = 1)": "dp1_gain",
    }
    rows = table(text, "| records per owner | control |")
    rows[0][-1] = "its gain (ε = 1)"  # the header names both DP gains "its gain"
    names = lambda cells: int(NUMBER.findall(plain(cells[0]))[0].replace(",", ""))  # noqa: E731
    assert check_table(rows, measured, columns, names=names) == 21
    owners = re.search(r"domain \((\d,\d{3}), (\d,\d{3}) and (\d,\d{3}); test loss", prose)
    assert round(sum(int(n.replace(",", "")) for n in owners.groups()) / 3) == 4584
    for suffix in (" @ 1000/owner", " @ all/owner"):
        assert f"test loss {pays['public model' + suffix]['loss']:.3f})" in prose
    points = curve["dp ε=8 + fine-tuning"]["points"]
    gains = [p["gain_nats"] for p in points]
    fit = curve["dp ε=8 + fine-tuning"]["fit"]
    assert fit["records_at_half"] is None and fit["b"] < 0
    assert (
        f"own gain stays at {min(gains):.2f}–{max(gains):.2f} nats from 1,000 to 4,584 records per owner, while "
        f"FedAvg's grows from {points[0]['fedavg_gain_nats']:.2f} to +{points[-1]['fedavg_gain_nats']:.2f} (BLEU "
        f"{pays['public + fedavg + fine-tuning @ all/owner']['bleu']:.1f} against the control's "
        f"{pays['control @ all/owner']['bleu']:.1f} at 4,584). The share falls, {points[1]['share']:.2f} → "
        f"{points[2]['share']:.2f}; its fit over the two points where FedAvg gains, share = {fit['a']:.2f} − "
        f"{-fit['b']:.3f}·ln(records)"
    ).replace("-0.", "−0.") in prose
    low = [abs(p["gain_nats"]) for c in curve.values() for p in c["points"] if p["records_per_owner"] == 1000]
    forgets = f"({points[0]['fedavg_gain_nats']:.2f} nats)".replace("-", "−")
    assert f"more of the public start than 3 × 1,000 pairs teach it {forgets}" in prose
    assert f"the DP runs are within {max(low):.2f} nats of the control" in prose

    # the verdict's figures (3,000 pairs per owner unless named)
    tuned8 = {k: r for k, r in pays.items() if k.startswith("dp ε=8") and k.endswith("+ fine-tuning") and "@" not in k}
    best = max(tuned8.values(), key=lambda r: r["gain_loss"])
    seed1 = by_run("dp-pays-seed1.json")["dp ε=8 + fine-tuning"]
    assert best["run"] == "dp ε=8 distributed b=8 + fine-tuning"
    assert (
        f"keeps {best['gain_loss']:.2f} of FedAvg's gain over the control after fine-tuning on the test set (banded "
        f"distributed noise, one seed) and {max(r['gain_own_loss'] for r in tuned8.values()):.2f} on own data (local "
        f"noise; {seed1['gain_own_loss']:.2f} with seed 1)"
    ) in prose
    before = {k: pays[k.removesuffix(" + fine-tuning")] for k in tuned8}
    served = [before[k]["bleu"] for k in tuned8 if "fedadam" not in k]
    assert f"its BLEU is {min(served):.1f}–{max(served):.1f} against the public model's" in prose
    e1, e1ft = pays["dp ε=1"], pays["dp ε=1 + fine-tuning"]
    assert (
        f"({e1ft['gain_loss']:.2f} and {e1ft['gain_own_loss']:.2f}, target 0.15), with BLEU {e1['bleu']:.1f}".replace(
            "-", "−"
        )
        in prose
    )
    losses = [r["loss"] for k, r in pays.items() if k.startswith("dp ε") and "+ fine-tuning" not in k and "@" not in k]
    assert f"({min(losses):.2f}–{max(losses):.2f} against {pays['public model']['loss']:.3f})" in prose
    local, spread, banded = (pays[k]["loss"] for k in ("dp ε=8", "dp ε=8 distributed", "dp ε=8 distributed b=8"))
    assert f"end at {spread:.3f} before fine-tuning against local noise's {local:.3f}" in prose
    assert f"at {banded:.3f}. After fine-tuning the three" in prose
    after = [pays[k + " + fine-tuning"]["loss"] for k in ("dp ε=8", "dp ε=8 distributed", "dp ε=8 distributed b=8")]
    assert f"are within {max(after) - min(after):.3f} nats of each other" in prose
    assert f"FedAvg's gain over the control is small here: {points[1]['fedavg_gain_nats']:.2f} nats" in prose
    adam, adam_ft = pays["dp ε=8 + fedadam"]["loss"], pays["dp ε=8 + fedadam + fine-tuning"]["loss"]
    assert (
        f"ends {adam - local:.2f} nats behind server SGD before fine-tuning and "
        f"{adam_ft - pays['dp ε=8 + fine-tuning']['loss']:.3f} after"
    ) in prose


def test_the_distributed_noise_tables_of_privacy_md_are_their_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    columns = {
        "σ": "sigma",
        "predicted std": "predicted_std",
        "measured std": "measured_std",
        "measured/predicted": "measured_over_predicted",
        "× per-owner": "over_per_owner",
        "secagg s": "secagg_s",
        "secagg bytes": "secagg_bytes",
    }
    header = "| ε | noise | σ | predicted std |"
    small = text[text.index("The same on the benchmark's setting") :]
    for name, part in (("dp-noise.json", text), ("dp-noise-small.json", small)):
        measured = {(f"{r['epsilon']:g}", r["mode"]): r for r in bench(name)}
        assert check_table(table(part, header), measured, columns, names=lambda c: (c[0], c[1]), skip=("noise",)) == 56
    tiny, small_rows = bench("dp-noise.json"), bench("dp-noise-small.json")
    assert f"over the {tiny[0]['coordinates'] / 1000:.0f}k coordinates" in prose
    assert f"LoRA r16 adapters, {small_rows[0]['coordinates'] / 1000:.0f}k trainable coordinates" in prose
    spread = next(r for r in tiny if r["mode"] == "distributed")
    bug = next(r for r in tiny if r["mode"].endswith("(bug)"))
    assert f"The distributed row is {spread['over_per_owner']:.3f} = 1/√3" in prose
    assert f"({bug['measured_over_predicted']:.2f} = √(2/3) of the prediction)" in prose

    # whole runs on the benchmark's setting: record-dp.json's per-owner rows, distributed-dp-small.json's rows
    refs = tuple(by_run("public.json")[r]["loss"] for r in ("public + local", "public + fedavg"))
    assert f"({refs[0]:.3f} − loss) / ({refs[0]:.3f} − {refs[1]:.3f})" in prose
    record = by_run("record-dp.json")
    spread = by_run("distributed-dp-small.json", "epsilon_target")
    measured = {}
    for e in (8, 1):
        r = record[f"public + fedavg lora r16 dp ε={e}"]
        measured[str(e), "per-owner"] = {
            "steps": NO_JSON,  # "~120": the planned DP steps are not in the JSON
            "loss": r["loss"],
            "gap": gap_closed(r["loss"], refs),
            "bleu": r["bleu"],
            "own": r["own_loss"],
            "bytes": [r["up_bytes"], r["down_bytes"]],
        }
        s = spread[e]
        measured[str(e), "distributed"] = {
            "steps": s["rounds"],
            "loss": s["test_loss"],
            "gap": gap_closed(s["test_loss"], refs),
            "bleu": s["bleu"],
            "own": sum(s["own_test_loss"]) / len(s["own_test_loss"]),
            "bytes": [s["up_per_client_per_round"], s["down_per_client_per_round"]],
            "secure": s["secure_s_per_round"],
        }
    columns = {
        "DP steps": "steps",
        "test loss": "loss",
        "gap closed": "gap",
        "BLEU": "bleu",
        "own-data loss (mean)": "own",
        "up / down B per owner per round": "bytes",
        "secure s per round": "secure",
    }
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    rows = table(text, "| ε | noise | DP steps | test loss | gap closed |")
    assert check_table(rows, measured, columns, names=lambda c: (c[0], c[1]), skip=("noise",)) == 28
    e8, d8 = measured["8", "per-owner"], measured["8", "distributed"]
    assert f"closes {100 * d8['gap']:.0f}% of the gap against {100 * e8['gap']:.0f}%" in prose
    assert f"BLEU stays at the public model's level ({by_run('public.json')['public model']['bleu']:.1f})" in prose
    sigma = next(r["sigma"] for r in small_rows if r["epsilon"] == 1 and r["mode"] == "distributed")
    assert f"At ε = 1, {spread[1]['rounds']} steps at σ = {sigma:.1f} do not" in prose
    assert (
        f"the server-and-one-owner ε is {spread[8]['epsilon_server_and_one_owner']:.1f} at ε = 8 and "
        f"{spread[1]['epsilon_server_and_one_owner']:.2f} at ε = 1"
    ) in prose
    sweep = bench("distributed-dp-small.json")["lr_sweep"]["rows"]
    assert (
        "test loss " + ", ".join(f"{r['test_loss']:.3f}" for r in sweep[:-1]) + f" and {sweep[-1]['test_loss']:.3f} "
        "at " + ", ".join(str(r["distributed_lr"]) for r in sweep[:-1]) + f" and {sweep[-1]['distributed_lr']}."
    ) in prose

    # the server's side on tiny (distributed-dp-tiny.json)
    measured = {
        (f"{r['epsilon_target']:g}", "per-owner" if r["noise"] == "local" else r["noise"]): r
        for r in bench("distributed-dp-tiny.json")
    }
    columns = {
        "test loss": "test_loss",
        "server's best advantage (score)": "advantage",
        "LiRA advantage": "lira_advantage",
        "ε_lb (ROC)": "epsilon_lb_roc",
        "ε_lb (one run)": "epsilon_lb_one_run",
        "ε, server + one owner": lambda r: r["epsilon_server_and_one_owner"] or r["epsilon"],
        "secure aggregation s per round": "secagg_s_per_round",
    }
    rows = table(text, "| ε | noise | test loss | server's best advantage (score) |")
    assert check_table(rows, measured, columns, names=lambda c: (c[0], c[1]), skip=("noise",)) == 28
    worst = max(abs(r[k]) for r in measured.values() for k in ("advantage", "lira_advantage"))
    assert f"the server's advantage within ±{worst:.2f} of none" in prose


def test_the_banded_noise_tables_and_audits_of_privacy_md_are_their_json():
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    prose = page("privacy.md")
    columns = {
        "q": "sample_rate",
        "batch per owner": "expected_batch",
        "σ of z": "sigma",
        "‖C‖_col": "column_norm",
        "last round ÷ fresh": "last_vs_fresh",
        "RMS ÷ fresh": "rms_vs_fresh",
    }
    header = "| ε | rounds | b | q | batch per owner |"
    for name, marker, count in (("dp-bands.json", "Batch 1,024 per owner", 42), ("dp-bands-256.json", "Batch 256", 42)):
        rows = bench(name)["rows"]
        measured = {(f"{r['epsilon']:g}", str(r["rounds"]), str(r["bands"])): r for r in rows}
        part = table(text[text.index(marker) :], header)
        assert check_table(part, measured, columns, names=lambda c: tuple(c[:3]), skip=("rounds", "b")) == count
        for r in rows:  # "predicted ... and measured ... (they agree within 2% in every row)"
            for kind in ("last", "rms"):
                assert abs(r[f"measured_{kind}"] / r[f"predicted_{kind}"] - 1) < 0.02, r
    best = min((r for r in bench("dp-bands-256.json")["rows"] if r["epsilon"] == 8), key=lambda r: r["last_vs_fresh"])
    assert (best["bands"], best["rounds"], best["expected_batch"]) == (8, 40, 256)
    assert f"the banded noise leaves {best['last_vs_fresh']:.2f} of the fresh noise in the last model (b = 8" in prose

    # the audit of the banded mechanism (audit-banded.json: b = 2; the fresh-noise and planted-bug rows have none)
    audit = {f"{r['epsilon']:g}": r for r in bench("audit-banded.json")["rows"]}
    assert bench("audit-banded.json")["command"].startswith(
        "trustformer attack audit --preset tiny --secure secagg --rounds 10 --set privacy.noise=distributed "
        "--set privacy.noise_bands=2"
    )
    rows = table(text, "| b | ε | ε_lb (one run) |")
    measured = {("2", e): {"lb": audit[e]["epsilon_lb_mean"]} for e in audit}
    measured |= {(b, "8"): {"lb": NO_JSON} for b in ("1 (fresh noise, the same command)", "2, canaries drawn")}

    def key(cells):
        b = plain(cells[0])
        return ("2, canaries drawn" if b.startswith("2, canaries drawn") else b), cells[1]

    assert check_table(rows, measured, {"ε_lb (one run)": "lb"}, names=key, skip=("ε",)) == 2
    assert f"raises ε_lb from {audit['8']['epsilon_lb_mean']:.2f} to 3.57" in prose


def test_the_audit_plants_table_of_privacy_md_is_audit_plants_json():
    """Noise taken out of one parameter group or one kind of tensor at a time (scripts/audit_plants.py). No JSON
    holds the per-step plants, the honest runs' table or the client-level plants (their scripts write to runs/)."""
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    runs = bench("audit-plants.json")
    honest = next(r for r in runs if r["what"] == "none")
    groups = [r for r in runs if r["what"] == "group"]
    kinds = [r for r in runs if r["what"] == "kind"]
    matrices = [g for g in groups if g["canaries"] > 64 and g["label"] != "embedding.weight"]
    embedding = [g for g in groups if g["label"] == "embedding.weight"]
    biases = [g for g in groups if g["canaries"] == 64]
    small = [g for g in groups if g["canaries"] == 32]
    assert len(matrices) + len(embedding) + len(biases) + len(small) == len(groups)

    def spread(values):
        return [min(values), max(values)] if min(values) != max(values) else [values[0]]

    def plants(rows, each=False):
        fails = sum(r["fails"] for r in rows)
        verdict = [] if len(rows) == 1 else [fails if fails == len(rows) else len(rows) - fails, len(rows)]
        assert fails in (0, len(rows)), "a row of the table is all fails or all passes"
        lbs = [r["epsilon_lb"] for r in rows]
        return {
            "groups": len(rows),
            "canaries": spread([r["canaries"] for r in rows]),
            "lb": lbs if each else spread(lbs),
            "audit": verdict,
        }

    measured = {
        "nothing": {"lb": honest["epsilon_lb"], "audit": []},
        "one weight matrix": plants(matrices),
        "the tied embedding": plants(embedding),
        "one feed-forward bias": plants(biases, each=True),
        "one 32-coordinate tensor": plants(small),
        "one layer type": plants(kinds, each=True),
    }
    rows = table(text, "| noise taken out of | groups | canaries there |")
    assert rows[0][3] == f"ε_lb (ε = {honest['epsilon']:.3f})"
    rows[0][3] = "ε_lb"
    columns = {"groups": "groups", "canaries there": "canaries", "ε_lb": "lb", "audit": "audit"}
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    assert check_table(rows, measured, columns, names=starts({k: k for k in measured})) == 33
    assert ", ".join(f"`{k['label']}`" for k in kinds) in rows[-1][0]
    assert not honest["fails"] and all(r["fails"] for r in matrices + embedding + biases + kinds)
    assert not any(r["fails"] for r in small)
    assert f"--json docs/bench/audit-plants.json`, {len(runs)} runs.)" in page("privacy.md")


def test_the_release_audit_tables_of_privacy_md_are_their_json():
    """The release view's tables (planted bugs per setting and factor; honest runs) are the rows
    scripts/release_audit_plants.py renders from docs/bench/release-audit-*.json, line for line; the figure is there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("release_audit_plants", ROOT / "scripts" / "release_audit_plants.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    plants, honest = bench("release-audit-plants.json"), bench("release-audit-honest.json")
    assert script.HEADER in text and script.HONEST_HEADER in text
    for row in plants:
        assert script.render(row) in text, script.render(row)
    for row in honest:
        assert script.render_honest(row) in text, script.render_honest(row)
    assert len(plants) == 64 and sum(r["seeds"] for r in honest) >= 5 * 40
    assert (ROOT / "docs" / "bench" / "release-audit.png").is_file()


# ---------------------------------------------------------------------------------------------- robustness.md
# No JSON holds the "Why these defaults" table (deviation norms and cosines read from debug logs) nor the share of
# triggered translations that keep the backdoor's first words (28.5%, scripts/backdoor_traces.py): both are named
# NO_JSON below or left out.


def test_the_100_client_robustness_table_is_its_json():
    text = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    prose = page("robustness.md")
    runs = {}
    for r in bench("robustness-100-clients.json")["rows"]:
        runs.setdefault(r["defence"], {})[r["fault"]] = r

    def cell(fault):
        def figures(by_fault):
            r = by_fault[fault]
            return (
                [r["test_loss"]] if r["defence"] == "none" and fault == "honest" else [r["test_loss"], r["loss_change"]]
            )

        return figures

    def events(by_fault):
        if by_fault["honest"]["defence"] == "none":
            return None
        if by_fault["honest"]["defence"] == "multikrum":  # "20 honest updates left out in every run"
            left_out = {r["events"]["excluded"] for r in by_fault.values()}
            assert len(left_out) == 1
            return [left_out.pop()]
        faults = ("scale", "sign_flip", "noise")
        return [by_fault[f]["events"]["refused"] for f in faults] + [by_fault["noise"]["events"]["clipped"]]

    columns = {f: cell(f) for f in ("honest", "sign_flip", "noise")} | {"scale −10": cell("scale")}
    columns["refused / left out per fault"] = events
    rows = table(text, "| defence | honest | scale −10 | sign_flip | noise |")
    assert check_table(rows, runs, columns, names=lambda c: plain(c[0]).split(" ")[0]) == 28
    assert f"The default defence's server time is {100 * runs['default']['honest']['cost_time']:.1f}% of these" in prose
    simulation = {r["fault"]: r for r in bench("robustness-100-clients-simulation.json")["rows"]}
    honest, flipped = simulation["honest"], simulation["sign_flip"]
    assert honest["test_loss"] == runs["default"]["honest"]["test_loss"]
    assert flipped["test_loss"] == runs["default"]["sign_flip"]["test_loss"]
    assert (
        f"The honest run ends at {honest['test_loss']:.3f} ({honest['wall_s']:.0f} s against "
        f"{runs['default']['honest']['wall_s']:.0f} s in process). With the 10 sign-flipping clients it also ends at "
        f"{flipped['test_loss']:.3f}, and all {flipped['events']['refused']} of their updates are refused "
        f"({flipped['wall_s']:.0f} s)"
    ) in prose


def test_the_stealthy_robustness_tables_are_robustness_stealthy_json():
    import math

    text = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    prose = page("robustness.md")
    rows = bench("robustness-stealthy.json")["rows"]

    def run(clients, malicious, defence, fault, share=None):
        found = [
            r
            for r in rows
            if (r["clients"], r["malicious"], r["defence"], r["fault"]) == (clients, malicious, defence, fault)
            and (share is None or r["backdoor_share"] == share)
        ]
        assert len(found) == 1, (clients, malicious, defence, fault, share)
        return found[0]

    def events(group, kinds=("clipped", "excluded")):
        return lambda r: None if r["defence"] == "none" else [r[group][k] for k in kinds]

    def success(r):
        return None if math.isnan(r["backdoor_success"]) else 100 * r["backdoor_success"]

    columns = {
        "test loss": "test_loss",
        "Δ vs honest": "loss_change",
        "BLEU": "bleu",
        "backdoor success": success,
        "events on client 1 (clipped / left out)": events("events_malicious"),
        "events on clients 0, 2 (clipped / left out)": events("events_honest"),
        "on the 9 honest clients (clipped / left out)": events("events_honest"),
        "defence s / round (share)": lambda r: (
            None if r["defence"] == "none" else [r["defence_s_per_round"], 100 * r["defence_share"]]
        ),
    }

    def key(clients):  # the rows of one setting, 1 malicious client, a tenth of its pairs poisoned
        def name(cells):
            fault = plain(cells[1]).split(" ")[0]
            return clients, 1, plain(cells[0]), fault, 0.1 if fault.startswith("backdoor") else None

        return name

    measured = {(r["clients"], r["malicious"], r["defence"], r["fault"], r["backdoor_share"]): r for r in rows}
    three = table(text, "| defence | fault | test loss | Δ vs honest | BLEU | backdoor success | events on client 1")
    assert check_table(three, measured, columns, names=key(3), skip=("fault",)) == 90
    ten = table(text[text.index("**10 clients, 1 malicious**") :], "| defence | fault | test loss |")
    assert check_table(ten, measured, columns, names=key(10), skip=("fault",)) == 52

    # stronger and crafted attacks, and the clean fine-tuning pass (its first words' share: no JSON)
    def crafted_row(r, first_words=()):
        defended = r["defence"] not in ("none", "root_finetune")
        attacker = [r["events_malicious"][k] for k in ("clipped", "excluded")]
        if r["events_malicious"]["excluded"] == r["rounds"]:
            attacker.append(r["rounds"])  # "6 of 6 rounds"
        attacker += [r["events_malicious"]["refused"]] if r["events_malicious"]["refused"] else []
        return {
            **r,
            "success": None if math.isnan(r["backdoor_success"]) else [100 * r["backdoor_success"], *first_words],
            "attacker": attacker if defended else None,
            "honest": [r["events_honest"][k] for k in ("clipped", "excluded")] if defended else None,
            "time": None if r["defence"] == "none" else [r["defence_s_per_round"], 100 * r["defence_share"]],
        }

    none, flame = run(3, 1, "none", "backdoor"), run(3, 1, "flame", "backdoor")
    crafted = {
        (10, "none", "backdoor"): crafted_row(run(10, 1, "none", "backdoor", 0.5)),
        (10, "none", "min_max"): crafted_row(run(10, 1, "none", "min_max")),
        (10, "flame", "backdoor"): crafted_row(run(10, 1, "flame", "backdoor", 0.5)),
        (10, "flame", "min_max"): crafted_row(run(10, 1, "flame", "min_max")),
        (3, "root_finetune", "honest"): crafted_row(run(3, 1, "root_finetune", "honest")),
        (3, "root_finetune", "backdoor"): crafted_row(run(3, 1, "root_finetune", "backdoor"), [NO_JSON]),
        (3, "none / flame", "backdoor"): {  # the 3-client table's rows again
            "test_loss": [none["test_loss"], flame["test_loss"]],
            "bleu": [none["bleu"], flame["bleu"]],
            "success": [100 * none["backdoor_success"], NO_JSON, 100 * flame["backdoor_success"], NO_JSON],
        },
    }
    columns = {
        "test loss": "test_loss",
        "Δ vs honest": "loss_change",
        "BLEU": "bleu",
        "backdoor success (whole sentence; its first words)": "success",
        "events on the attacker (clipped / left out)": "attacker",
        "on honest clients": "honest",
        "defence s / round (share)": "time",
    }
    columns = {head: (lambda r, key=key: r.get(key)) for head, key in columns.items()}
    table_ = table(text, "| clients | defence | fault |")
    names = lambda c: (int(c[0]), plain(c[1]), plain(c[2]).split(",")[0].split(" ")[0])  # noqa: E731
    assert check_table(table_, crafted, columns, names=names, skip=("clients", "fault")) == 45
    assert plain(table_[6][6]).startswith("0.0%; 28.5%")  # 28.5%: the first words' share, no JSON holds it
    min_max, flame_min_max = crafted[10, "none", "min_max"], crafted[10, "flame", "min_max"]
    ten_alie = run(10, 1, "none", "alie")
    assert f"costs +{min_max['loss_change']:.3f} undefended at 10 clients" in prose
    assert (
        f"it costs +{flame_min_max['loss_change']:.3f} against the undefended honest run and "
        f"+{flame_min_max['vs_defended_honest']:.3f} against FLAME's own honest run"
    ) in prose
    assert f"({flame_min_max['events_honest']['excluded']} left out)" in prose
    worst = max(min_max["loss_change"], ten_alie["loss_change"])
    assert f"ALIE and min-max cost at most +{worst:.3f} at 1 of 10 undefended" in prose

    # 10 clients, 2 malicious, colluding
    colluding = {(r["defence"], r["fault"]): r for r in rows if (r["clients"], r["malicious"]) == (10, 2)}
    columns = {
        "test loss": "test_loss",
        "Δ vs honest": "loss_change",
        "BLEU": "bleu",
        "events on the attackers (clipped / refused / left out)": lambda r: (
            None
            if r["defence"] == "none" or (r["defence"], r["fault"]) == ("default", "honest")
            else [r["events_malicious"][k] for k in ("clipped", "refused", "excluded")]
        ),
        "on honest clients": events("events_honest"),
        "defence s / round (share)": lambda r: (
            None if r["defence"] == "none" else [r["defence_s_per_round"], 100 * r["defence_share"]]
        ),
    }
    table_ = table(text, "| defence | fault | test loss | Δ vs honest | BLEU | events on the attackers")
    names = lambda c: (plain(c[0]).split(" ")[0], plain(c[1]))  # noqa: E731
    assert check_table(table_, colluding, columns, names=names, skip=("fault",)) == 56
    flame, honest_flame = colluding["flame", "min_max"], colluding["flame", "honest"]
    assert (
        f"FLAME ends +{flame['test_loss'] - honest_flame['test_loss']:.3f} above its own honest run and "
        f"+{flame['loss_change']:.3f} above the undefended honest one"
    ) in prose
    bound = colluding["default", "min_max"]
    assert (
        f"The default bound holds min-max at 2 of 10 to +{bound['loss_change']:.3f} nats, at no cost to the honest "
        f"run** ({colluding['default', 'honest']['test_loss']:.3f} to the last digit): its direction check refuses "
        f"{bound['events_malicious']['refused']} of the attackers' 12 updates"
    ) in prose
    root = run(3, 1, "root_finetune", "honest")
    assert f"for +{root['loss_change']:.3f} nats. Translation" in prose
    assert f"it costs +{root['loss_change']:.3f} nats and leaves the backdoor's first words" in prose
    assert f"while raising BLEU ({run(3, 1, 'none', 'honest')['bleu']:.2f} → {root['bleu']:.2f})" in prose


# ---------------------------------------------------------------------------------- benchmarks.md and others
# No JSON holds: benchmarks.md's k-means measurements, image-task table, earlier three-run table and the
# invocations' total wall times (89 min, 74.6 min, 46.4 + 31.2 min, 13.9 min, 1.6 min: the bench prints them, the
# JSON keeps each run's own wall time); protocols.md's membership-mode, server-optimizer and rounding tables and its
# public-data table's pair counts and training times; data.md's recipe table; reproduction.md's tables.


def test_the_benchmarks_lira_table_is_lira_tiny_json():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    runs = {r["run"]: r for r in bench("lira-tiny.json")["runs"]}
    names = {
        "training alone": "local",
        "FedAvg": "fedavg",
        "Trustformer β = 0.5": "trustformer β=0.5 rotating",
        "top-k 0.25": "fedavg-topk",
        "FedAvg + secure aggregation": "fedavg +secagg",
        "Trustformer β = 0.5 + secure aggregation": "trustformer β=0.5 rotating +secagg",
    }
    models = {"true local": "true-local", "server = true local": "server", "server": "server"}
    models["server (the aggregate)"] = "server"

    def score(name):
        def figures(r):
            model = r[models[r["model_shown"]]][name]
            return [model["auc_mean"], model["tpr_at_0.01_fpr_mean"]]

        return figures

    rows = table(text, "| run | model | loss | calibrated-global | **LiRA** |")
    for cells in rows[1:]:  # the model each row reads
        runs[names[plain(cells[0])]]["model_shown"] = plain(cells[1])
    assert runs["local"]["server_sees"] == "nothing" and runs["fedavg +secagg"]["server_sees"] == "aggregate only"
    columns = {
        "loss": score("loss"),
        "calibrated-global": score("calibrated-global"),
        "LiRA": score("lira"),
        "server's advantage (score)": lambda r: r["advantage"]["auc_minus_half"],
    }
    rows[0][4] = "LiRA"
    assert check_table(rows, runs, columns, names=names, skip=("model",)) == 42
    for cells in rows[1:]:  # the score named is the server's best
        best = runs[names[plain(cells[0])]]["advantage"]["score"]
        assert f"({'LiRA' if best == 'lira' else best})" in cells[-1] or names[plain(cells[0])] == "local"
    prose = page("benchmarks.md")
    alone, fedavg = runs["local"]["true-local"], runs["fedavg"]["server"]
    assert (
        f"(training alone: TPR at 1% FPR {alone['lira']['tpr_at_0.01_fpr_mean']:.3f} against "
        f"{alone['loss']['tpr_at_0.01_fpr_mean']:.3f})"
    ) in prose
    earlier = max(v["auc_mean"] for k, v in fedavg.items() if k != "lira") - 0.5
    assert (
        f"from {earlier:.3f} (the best earlier score) to {runs['fedavg']['advantage']['auc_minus_half']:.3f}" in prose
    )


def test_the_benchmarks_scale_block_run_counts_and_wall_times_are_their_json():
    from trustformer_lab.bench.scale_bench import format_table

    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    scale = bench("scale.json")["rows"]
    start = text.index("trustformer bench scale --json docs/bench/scale.json")
    assert _block(text[start:], "engine ") == format_table(scale), "rerender it: format_table(scale.json's rows)"
    prose = page("benchmarks.md")
    ratio = {r["engine"]: r["s_per_round"] for r in scale if r["clients"] == 1000}
    base = {r["engine"]: r["s_per_round"] for r in scale if r["clients"] == 10}
    assert (
        f"a round takes {ratio['inprocess'] / base['inprocess']:.2f}× (in process) and "
        f"{ratio['simulation'] / base['simulation']:.2f}× (Simulation Engine) what it takes at 10"
    ) in prose
    memory = (
        [r["peak_mb"] for r in scale if r["engine"] == "simulation"],
        [r["peak_mb"] for r in scale if r["engine"] == "inprocess"],
    )
    extra = sum(memory[0]) / 3 - sum(memory[1]) / 3
    per_round = (
        sum(r["s_per_round"] for r in scale if r["engine"] == "simulation") / 3
        - sum(r["s_per_round"] for r in scale if r["engine"] == "inprocess") / 3
    )
    assert f"costs about {extra / 1000:.1f} GB more than in process" in prose
    assert f"and about {per_round:.1f} s more per round" in prose

    def runs(name, select=lambda r: True):  # runs of a bench: each row's seeds, its fine-tuned twin not counted
        return sum(len(r["seeds"]) for r in bench(name)["rows"] if not r["run"].endswith("+ fine-tuning") and select(r))

    assert f"The default setting, on an idle 2-core machine: {runs('frontier.json')} runs" in prose
    two_bit = runs("frontier.json", lambda r: "2-bit" in r["run"])
    assert f"(the {runs('frontier.json') - two_bit} runs without 2-bit coding" in prose
    assert two_bit == 6 and "then the six 2-bit runs" in prose
    assert f"continued with `--reuse`: {runs('public.json')} runs, " in prose
    assert f"{runs('floor-off.json')} runs in 13.9 min." in prose
    record = by_run("record-dp.json")
    walls = [
        record[r]["wall_s"] for r in ("local", "fedavg", *(k for k in record if "dp ε" in k and "+ fine" not in k))
    ]
    assert (
        f"`local` {walls[0]:,.0f} s, `fedavg` {walls[1]:,.0f} s, the two DP rows {walls[2]:,.0f} s and "
        f"{walls[3]:,.0f} s"
    ) in prose


def test_the_client_dp_scale_table_is_dp_scale_json():
    text = (ROOT / "docs" / "client-dp.md").read_text(encoding="utf-8")
    rows = bench("dp-scale.json")["rows"]
    measured = {r["label"]: r for r in rows}
    columns = {
        "m / round": lambda r: None if r["strategy"] == "local" else r["per_round"],
        "test loss": "test_loss",
        "gain retained": "gain",
        "ε spent": lambda r: r.get("epsilon"),
        "σ": lambda r: r.get("sigma"),
        "σ_Δ": lambda r: r.get("update_sigma"),
        "C at end": lambda r: r.get("clip_end"),
        "σ/m": lambda r: r.get("sigma_per_m"),
        "σ·C/m": lambda r: r.get("noise_std"),
        "s/round": "s_per_round",
        "wall s": "wall_s",
    }
    table_ = table(text, "| run | m / round | test loss |")
    assert check_table(table_, measured, columns, names=starts({k: k for k in measured})) == 31
    assert f"alone ({measured['alone']['clients']} of the clients)" in table_[1][0]
    prose = page("client-dp.md")
    assert f"Measured ({sum(r['wall_s'] for r in rows) / 60:.1f} min, one core" in prose
    alone, fedavg = measured["alone"], measured["fedavg m=100"]
    fixed, adaptive = measured["dp-fedavg fixed ε=8 m=100"], measured["dp-fedavg adaptive ε=8 m=100"]
    assert f"{fedavg['test_loss']:.2f} against {alone['test_loss']:.2f} nats" in prose
    assert f"{adaptive['test_loss']:.2f}–{fixed['test_loss']:.2f} nats, a gain" in prose
    assert f"of −{-adaptive['gain']:.1f} to −{-fixed['gain']:.1f}" in prose
    assert f"from {fixed['clip_end']:.1f} to {adaptive['clip_end']:.2f} in 3 rounds" in prose
    assert f"It ended {fixed['test_loss'] - adaptive['test_loss']:.2f} nats better than fixed" in prose
    assert f"σ_Δ = {adaptive['update_sigma']:.3f} against σ = {adaptive['sigma']:.3f}" in prose
    assert f"σ/m = {fixed['sigma_per_m']:.4f}, the measured ε = 8" in prose


def test_the_protocols_public_start_figures_are_their_json():
    text = (ROOT / "docs" / "protocols.md").read_text(encoding="utf-8")
    split = finetuned("finetune-e8-bleu.json", "public", 0)
    ui, dedup = finetuned("finetune-ui-e8.json", "public", 0), finetuned("finetune-ui-dedup-e8.json", "public", 0)
    fedavg = by_run("dp-recipe-10.json")["public + fedavg"]
    measured = {
        "the corpus's public split": split,
        "split + Debian UI catalogs, exact deduplication": ui,
        "split + Debian UI catalogs, today's deduplication": dedup,
        "*for scale: public split + FedAvg of the 3 owners, 10 rounds, no DP*": {
            "test_loss": fedavg["loss"],
            "test_bleu": fedavg["bleu"],
            "test_chrf": NO_JSON,
        },
    }
    columns = {"pairs (dropped)": NO_JSON, "train s": NO_JSON, "test loss": "test_loss", "BLEU": "test_bleu"}
    columns["chrF"] = "test_chrf"
    assert check_table(table(text, "| public data | pairs (dropped) |"), measured, columns) == 11
    prose = page("protocols.md")
    public = by_run("public.json")
    tf, lora, local = (
        public["public + trustformer β=0.5 lora r16"],
        public["public + fedavg lora r16"],
        public["public + local"],
    )
    coded = public["public + fedavg lora r16 4-bit"]
    assert (
        f"rank-16 adapters reaches test loss {tf['loss']:.3f}. FedAvg over the same adapters reaches "
        f"{lora['loss']:.3f}, and the public start with training alone {local['loss']:.3f}. Trustformer thus keeps "
        f"{gap_closed(tf['loss'], (local['loss'], lora['loss'])):.2f} of what FedAvg"
    ) in prose
    full = by_run("frontier.json")["trustformer β=0.5"]
    assert f"(on the full model from scratch it keeps {full['gain_loss']:.2f})" in prose
    assert (
        f"({coded['gain_loss']:.2f} of the from-scratch gain at {coded['upload_vs_fedavg']:.4f}× FedAvg's upload with "
        f"4-bit adapters, against Trustformer's {tf['gain_loss']:.2f} at {tf['upload_vs_fedavg']:.3f}×, whose server's "
        f"membership advantage is also higher: {tf['mia_advantage']:.2f} against {coded['mia_advantage']:.2f})"
    ) in prose


def test_the_dp_levers_table_is_its_json():
    """docs/privacy.md's two levers on the second seed, figure by figure (the wall times are the script's log)."""
    levers = by_run("dp-pays-levers-seed1.json")
    privacy = (ROOT / "docs" / "privacy.md").read_text(encoding="utf-8")
    rows = table(privacy, "| lever (+ fine-tuning) |")
    lever_columns = {
        "test loss": "loss",
        "own loss": "own_loss",
        "share of FedAvg's gain, test / own": ("gain_loss", "gain_own_loss"),
        "wall time": NO_JSON,  # the script's log, not its JSON
    }
    lever_names = lambda cells: plain(cells[0]).split(":")[0].strip("`") + " + fine-tuning"  # noqa: E731
    assert check_table(rows, levers, lever_columns, names=lever_names) == 12


def test_the_scaffold_and_public_robustness_tables_are_their_json():
    """docs/benchmarks.md's SCAFFOLD rounds and docs/robustness.md's 10-owner public-start table, figure by figure."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    runs = bench("scaffold-seed0.json")["runs"]
    measured = {
        str(i + 1): {"fedavg": f, "scaffold": s}
        for i, (f, s) in enumerate(zip(runs["fedavg"]["losses"], runs["scaffold"]["losses"], strict=True))
    }
    rows = table(text, "| round | FedAvg test loss | SCAFFOLD test loss |")
    assert check_table(rows, measured, {"FedAvg test loss": "fedavg", "SCAFFOLD test loss": "scaffold"}) == 20
    robust = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    public = bench("robustness-public.json")["rows"]

    def variant(r: dict) -> str:
        """The second table's first cell for a row (the first table's rows: every round, full model)."""
        if r.get("adapters", "none") != "none":
            return "LoRA r16"
        if r.get("mask"):
            return f"Neurotoxin (mask {r['mask']:g}), leaves after round {r['attack_rounds']}"
        if r.get("attack_rounds"):
            return f"leaves after round {r['attack_rounds']}"
        return f"trigger {r['trigger']}" if r.get("trigger") else ""

    def fault_of(cell: str) -> str:
        return "honest" if cell.startswith("—") else plain(cell).split(",")[0].split(" (")[0].strip("`")

    main = {(str(r["malicious"]), r["defence"], r["fault"]): r for r in public if not variant(r)}

    def own_change(r: dict) -> list[float]:
        """The smallest and largest of the honest owners' own-loss changes from the undefended honest run of the same
        setting ([0]: that run)."""
        if r["fault"] == "honest" and r["defence"] == "none":
            return [0.0]
        reference = main[str(r["malicious"]), "none", "honest"]
        changes = [a - b for a, b in zip(r["own_loss_per_owner"], reference["own_loss_per_owner"], strict=True)]
        return [min(changes), max(changes)]

    columns = {
        "test loss (honest owners)": "test_loss",
        "BLEU": "bleu",
        "backdoor success": lambda r: (
            None if r["backdoor_success"] != r["backdoor_success"] else 100 * r["backdoor_success"]
        ),
        "defence's time / rounds'": lambda r: 100 * r["defence_share"] if r["defence_share"] else 0,
        "own loss per owner: change from the undefended honest run": own_change,
        "backdoor success, rounds 1–10": lambda r: [100 * x for x in r.get("backdoor_per_round") or []] or None,
    }
    rows = table(robust, "| attackers of 10 | defence | fault |")
    main_key = lambda cells: (cells[0], plain(cells[1]).strip("`"), fault_of(cells[2]))  # noqa: E731
    assert check_table(rows, main, columns, names=main_key, skip=("attackers of 10", "fault")) >= 100
    by_variant = {(variant(r) or "every round (the table above)", r["defence"], r["fault"]): r for r in public}
    rows = table(robust, "| variant | defence | fault |")
    variant_key = lambda cells: (plain(cells[0]).replace("`", ""), plain(cells[1]).strip("`"), fault_of(cells[2]))  # noqa: E731
    assert check_table(rows, by_variant, columns, names=variant_key, skip=("variant", "fault")) >= 60
