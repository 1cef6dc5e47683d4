"""The public corpus from Debian's Russian UI message catalogs (data/ui_catalogs.py): a catalog this test builds,
packed into a real .deb and run through the builder (dpkg-deb, parsing, cleaning, cache), then deduplicated
against the clients' data and the test sets by the public model's own step."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from trustformer.config import ConfigError, load_config
from trustformer.data import ui_catalogs
from trustformer.tasks import public as pub
from trustformer.tasks import translation_workload as wl

UI = "usr/lib/libreoffice/program/resource/ru/LC_MESSAGES"
ENTRIES = {
    "Open File": "Открыть файл",
    "menu\x04~Save As": "Сохранить ~как",  # a context, mnemonics
    "L_andscape": "_Альбомная",
    "Untranslated": "Untranslated",  # no Cyrillic: dropped
    "<b>Bold</b> text": "<b>Жирный</b> текст",  # markup: dropped
    "Insert\nRows": "Вставить\nстроки",  # a line break: one space
}


def write_mo(path: Path, entries: dict[str, str]) -> None:
    """A gettext .mo catalog (GNU format, no hash table) holding ``entries`` (msgid → msgstr), UTF-8 as its header
    entry says."""
    entries = {"": "Content-Type: text/plain; charset=UTF-8\n", **entries}
    keys = sorted(entries)
    ids = [k.encode() for k in keys]
    strs = [entries[k].encode() for k in keys]
    start = 7 * 4 + 16 * len(keys)
    blob, id_table, str_table = b"", [], []
    for raw in ids:
        id_table.append((len(raw), start + len(blob)))
        blob += raw + b"\0"
    for raw in strs:
        str_table.append((len(raw), start + len(blob)))
        blob += raw + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 28, 28 + 8 * len(keys), 0, 0)
    tables = b"".join(struct.pack("<2I", *x) for x in id_table) + b"".join(struct.pack("<2I", *x) for x in str_table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables + blob)


def test_a_catalog_gives_its_cleaned_pairs_and_only_ui_catalogs_are_read(tmp_path):
    write_mo(tmp_path / UI / "ui.mo", ENTRIES)
    write_mo(tmp_path / "usr/share/help/ru/help.mo", {"Help page": "Страница справки"})
    write_mo(tmp_path / "usr/share/locale/de/LC_MESSAGES/ui.mo", {"Open File": "Datei öffnen"})
    assert ui_catalogs.ui_catalogs(tmp_path) == [tmp_path / UI / "ui.mo"]
    pairs = ui_catalogs.tree_pairs(tmp_path)
    assert sorted(pairs) == sorted(
        [
            ("Открыть файл", "Open File"),
            ("Сохранить как", "Save As"),
            ("Альбомная", "Landscape"),
            ("Вставить строки", "Insert Rows"),
        ]
    )


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian tools)")
def test_the_builder_unpacks_parses_and_caches_a_package(tmp_path, monkeypatch):
    """A real .deb built here stands for the apt-get download (the only step that needs the network)."""
    tree = tmp_path / "pkg"
    write_mo(tree / UI / "ui.mo", ENTRIES)
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: libreoffice-l10n-ru\nVersion: 1:0.1\nArchitecture: all\nMaintainer: test <t@example.org>\n"
        "Description: test catalog\n",
        encoding="utf-8",
    )
    deb = tmp_path / "libreoffice-l10n-ru_0.1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True, capture_output=True)
    downloads = []

    def download(packages, dest):
        downloads.append(packages)
        return {packages[0]: deb}

    monkeypatch.setattr(ui_catalogs, "apt_download", download)
    messages: list[str] = []
    pairs = ui_catalogs.load_ui_corpus(tmp_path / "cache", messages.append)
    assert ("Альбомная", "Landscape") in pairs and len(pairs) == 4
    built = tmp_path / "cache" / ui_catalogs.CORPUS_NAME / "1_0.1"
    assert (built / "pairs.tsv").is_file() and "MPL-2.0" in (built / "LICENSE-NOTICE.txt").read_text()
    assert ui_catalogs.load_ui_corpus(tmp_path / "cache", messages.append) == pairs  # from the cache
    assert len(downloads) == 1


def test_the_public_corpus_drops_every_pair_a_client_or_a_test_set_holds(tmp_path, monkeypatch):
    """Catalog pairs that repeat a client's training pair, a client's held-out pair or a shared-test pair are
    dropped and counted; building without that step lets them through (the planted bug fails the check)."""
    cfg = load_config(
        "tiny",
        None,
        {
            "train.init": "public",
            "train.public_source": "debian-ui",
            "data.partition": "domain",
            "data.own_test_size": 10,
        },
    )
    workload = wl.load_workload(cfg)
    leaked = workload.shard(0)[:3] + workload.own_test(1)[:2] + list(workload.splits.test[:2])
    own = [("Совершенно новая строка интерфейса", "A brand new interface string")]
    write_mo(tmp_path / UI / "ui.mo", {en: ru for ru, en in leaked + own})
    catalog = ui_catalogs.tree_pairs(tmp_path)
    assert set(leaked + own) <= set(catalog)
    monkeypatch.setattr(pub, "load_ui_corpus", lambda root, report: catalog)
    private = pub.private_sentences(workload)
    pairs, dropped = pub.public_pairs(cfg, workload)
    assert own[0] in pairs and dropped >= len(leaked)
    assert not {pub.sentence_key(side) for pair in pairs for side in pair} & private
    monkeypatch.setattr(pub, "private_sentences", lambda workload: set())  # planted: no deduplication
    pairs, dropped = pub.public_pairs(cfg, workload)
    assert dropped == 0 and {pub.sentence_key(side) for pair in pairs for side in pair} & private


def test_the_public_source_and_a_public_file_are_one_choice():
    with pytest.raises(ConfigError, match="train.public_source"):
        load_config("tiny", None, {"train.init": "public", "train.public_source": "debian", "out": ""})
    with pytest.raises(ConfigError, match="give one"):
        load_config(
            "tiny",
            None,
            {"train.init": "public", "train.public_source": "debian-ui", "train.public_data": "x.tsv", "out": ""},
        )
