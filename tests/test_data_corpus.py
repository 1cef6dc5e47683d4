"""Corpus loaders: TSV files, WMT19-format files and the LibreOffice help corpus."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trustformer.data import debian_build
from trustformer.data.corpus import (
    CorpusUnavailableError,
    default_cache_dir,
    extract_help_paragraphs,
    load_libreoffice_corpus,
    load_tsv,
    load_wmt19,
    write_tsv,
)

CYRILLIC = re.compile(r"[А-Яа-яЁё]")

# --------------------------------------------------------------------------------------------------
# TSV


def test_load_tsv_accepts_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.tsv"
    path.write_bytes("Привет\tHello\r\n\n  \nКак дела?\tHow are you?\n".encode())
    assert load_tsv(path) == [("Привет", "Hello"), ("Как дела?", "How are you?")]


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        (b"one\ttwo\nno tab here\n", 2, "exactly one tab"),
        (b"one\ttwo\n\na\tb\tc\n", 3, "found 2"),
        (b"\tonly target\n", 1, "empty source"),
        (b"ok\tfine\nsource only\t  \n", 2, "empty target"),
        (b"ok\tfine\nok\tfine\n\xff\xfe\tbroken\n", 3, "invalid UTF-8"),
    ],
)
def test_load_tsv_rejects_malformed_lines(tmp_path: Path, content: bytes, line: int, problem: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_tsv(path)
    message = str(info.value)
    assert f"line {line}:" in message
    assert problem in message
    assert "bad.tsv" in message


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_load_tsv_rejects_file_without_pairs(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="no pairs"):
        load_tsv(path)


def test_write_tsv_round_trips(tmp_path: Path) -> None:
    pairs = [("Файл", "File"), ("Правка", "Edit")]
    write_tsv(pairs, tmp_path / "out" / "pairs.tsv")
    assert load_tsv(tmp_path / "out" / "pairs.tsv") == pairs
    with pytest.raises(ValueError, match="tab or newline"):
        write_tsv([("a\tb", "c")], tmp_path / "x.tsv")


def test_default_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRUSTFORMER_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TRUSTFORMER_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "trustformer"


# --------------------------------------------------------------------------------------------------
# WMT19 format


WMT_ROWS = [
    {"translation": {"ru": "Машина едет быстро.", "en": "The car is fast."}},
    {"translation": {"ru": "  Кошка   спит. ", "en": "The cat sleeps."}},
    {"translation": {"ru": "", "en": "Dropped: empty source."}},
    {"translation": {"ru": "Дом большой.", "en": "The house is big."}},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def test_load_wmt19_local_jsonl(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    data = _write_jsonl(tmp_path / "wmt.jsonl", WMT_ROWS)
    pairs = load_wmt19(data_files=str(data))
    assert pairs == [
        ("Машина едет быстро.", "The car is fast."),
        ("Кошка спит.", "The cat sleeps."),
        ("Дом большой.", "The house is big."),
    ]
    assert load_wmt19(data_files=[str(data)], limit=2) == pairs[:2]
    assert load_wmt19("validation", data_files=str(data), source_lang="en", target_lang="ru")[0] == (
        "The car is fast.",
        "Машина едет быстро.",
    )


def test_load_wmt19_rejects_wrong_row_shape(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    data = _write_jsonl(tmp_path / "bad.jsonl", [{"translation": {"de": "Hallo", "en": "Hello"}}])
    with pytest.raises(ValueError, match="WMT19 shape"):
        load_wmt19(data_files=str(data))


def test_load_wmt19_without_datasets_names_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(CorpusUnavailableError, match=re.escape("pip install trustformer[hf]")):
        load_wmt19(limit=1)


# --------------------------------------------------------------------------------------------------
# LibreOffice help: parsing


HELP_PAGE = """<html><head><script>var x = "<p id='par_id9'>no</p>";</script></head><body>
<h1 id="hd_id1" dir="auto">Параметры &amp; настройки</h1>
<p id="par_id2" class="paragraph">Нажмите <span class="switchinline"><span hidden="true" id="MACtext_1"
 class="MAC"><span class="keycode">Command</span></span><span hidden="true" id="defaulttext_1"><span
 class="keycode">Ctrl</span></span></span><span class="keycode"> + F</span>,<br>чтобы
 <a href="x.html">открыть</a> <img src="i.svg" alt="Icon"> поиск.</p>
<p id="par_id2">Второй раз
<p id="par_id3">implicitly closed</p>
<div id="not_a_paragraph">ignored</div>
</body></html>"""


def test_extract_help_paragraphs_visible_text() -> None:
    paragraphs = extract_help_paragraphs(HELP_PAGE)
    assert paragraphs[("hd_id1", 0)] == "Параметры & настройки"
    assert paragraphs[("par_id2", 0)] == "Нажмите Ctrl + F, чтобы открыть поиск."
    assert paragraphs[("par_id2", 1)] == "Второй раз"
    assert paragraphs[("par_id3", 0)] == "implicitly closed"
    assert set(paragraphs) == {("hd_id1", 0), ("par_id2", 0), ("par_id2", 1), ("par_id3", 0)}


# --------------------------------------------------------------------------------------------------
# LibreOffice help: errors without apt


def test_missing_apt_names_alternatives(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(debian_build.shutil, "which", lambda tool: None)
    with pytest.raises(CorpusUnavailableError) as info:
        load_libreoffice_corpus(tmp_path)
    message = str(info.value)
    assert "apt-get" in message and "--data FILE.tsv" in message and "wmt19" in message


def test_package_not_found_suggests_apt_update(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(
            cmd, 100, stdout="", stderr="Reading package lists...\nE: Unable to locate package libreoffice-help-ru\n"
        )

    monkeypatch.setattr(debian_build.shutil, "which", lambda tool: f"/bin/{tool}")
    monkeypatch.setattr(debian_build.subprocess, "run", fake_run)
    with pytest.raises(CorpusUnavailableError) as info:
        load_libreoffice_corpus(tmp_path)
    message = str(info.value)
    assert "Unable to locate package libreoffice-help-ru" in message
    assert "apt-get update" in message
    assert "--data FILE.tsv" in message


# --------------------------------------------------------------------------------------------------
# LibreOffice help: the real corpus (downloads about 5 MB from the Debian archive)


def _ensure_apt_candidate() -> None:
    """Run `apt-get update` only when the package lists do not know the help packages."""
    policy = subprocess.run(
        ["apt-cache", "policy", "libreoffice-help-ru"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"Candidate:\s*(\S+)", policy)
    if match is None or match.group(1) == "(none)":
        subprocess.run(["apt-get", "update"], capture_output=True, check=True, timeout=600)


@pytest.fixture(scope="session")
def libreoffice_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str]], list[str]]:
    if not all(shutil.which(tool) for tool in ("apt-get", "apt-cache", "dpkg-deb")):
        pytest.skip("apt-get/dpkg-deb not available: the LibreOffice corpus needs a Debian-based system")
    _ensure_apt_candidate()
    cache = tmp_path_factory.mktemp("trustformer-cache")
    messages: list[str] = []
    pairs = load_libreoffice_corpus(cache, progress=messages.append)
    return cache, pairs, messages


def test_libreoffice_corpus_content(libreoffice_build) -> None:
    cache, pairs, messages = libreoffice_build
    assert len(pairs) > 15_000
    assert all(CYRILLIC.search(ru) for ru, _ in pairs)
    assert all(ru != en and ru and en for ru, en in pairs)
    assert pairs == sorted(set(pairs))
    assert not any("\t" in ru or "\t" in en or "\n" in ru + en for ru, en in pairs)
    assert ("Сохранить как", "Save As") in pairs
    assert ("Выберите Файл - Печать.", "Choose File - Print.") in pairs
    assert any("aligned" in m for m in messages) and any("download" in m for m in messages)


def test_libreoffice_cache_layout(libreoffice_build) -> None:
    cache, pairs, _ = libreoffice_build
    (pairs_file,) = (cache / "libreoffice-ru-en").glob("*/pairs.tsv")
    notice = (pairs_file.parent / "LICENSE-NOTICE.txt").read_text(encoding="utf-8")
    assert "MPL-2.0" in notice and "The Document Foundation" in notice
    assert "libreoffice-help-ru" in notice and "libreoffice-help-en-us" in notice
    assert load_tsv(pairs_file) == pairs
    leftovers = [p for p in pairs_file.parent.parent.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_libreoffice_second_call_uses_cache(libreoffice_build, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, pairs, _ = libreoffice_build

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"apt must not be called when the corpus is cached: {args}")

    monkeypatch.setattr(debian_build.subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    messages: list[str] = []
    assert load_libreoffice_corpus(cache, progress=messages.append) == pairs
    assert any("cached" in m for m in messages)


def test_tsv_domain_column(tmp_path: Path) -> None:
    from trustformer.data.corpus import load_tsv_domains

    path = tmp_path / "d.tsv"
    path.write_text("Привет\tHello\tgreetings\nКак дела?\tHow are you?\tsmall talk\n", encoding="utf-8")
    assert load_tsv_domains(path) == ([("Привет", "Hello"), ("Как дела?", "How are you?")], ["greetings", "small talk"])
    assert load_tsv(path) == [("Привет", "Hello"), ("Как дела?", "How are you?")]
    write_tsv([("а", "a")], tmp_path / "w.tsv", ["x"])
    assert load_tsv_domains(tmp_path / "w.tsv") == ([("а", "a")], ["x"])
    path.write_text("Привет\tHello\tgreetings\nКак дела?\tHow are you?\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected two tabs"):
        load_tsv_domains(path)
    path.write_text("Привет\tHello\t \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty domain"):
        load_tsv_domains(path)


def test_help_module_of_a_page() -> None:
    from trustformer.data.corpus import help_module

    assert help_module(Path("text/scalc/01/func_sum.html")) == "calc"
    assert help_module(Path("text/shared/guide/main.html")) == "shared"
    assert help_module(Path("noscript.html")) == "other"
