"""Parallel Russian→English corpora: the offline LibreOffice help corpus, TSV files and WMT19.

Every loader returns a list of ``(source, target)`` pairs where the source is Russian and the target
English. The default corpus is built from Debian's LibreOffice help packages (see ``DATA.md``): the
Russian and English help pages carry the same paragraph ids, so paragraphs join on
(file, element id, occurrence). The help text is licensed MPL-2.0 by The Document Foundation; the built
corpus keeps that attribution in ``LICENSE-NOTICE.txt`` beside ``pairs.tsv``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from ..errors import TrustformerError

__all__ = [
    "CorpusUnavailableError",
    "LIBREOFFICE_PACKAGES",
    "Pair",
    "align_help_trees",
    "default_cache_dir",
    "extract_help_paragraphs",
    "load_libreoffice_corpus",
    "load_tsv",
    "load_tsv_domains",
    "load_libreoffice_domains",
    "help_module",
    "load_wmt19",
    "write_tsv",
]

logger = logging.getLogger(__name__)

Pair = tuple[str, str]
"""A translation pair: (source = Russian, target = English)."""

Progress = Callable[[str], None]

EN_PACKAGE = "libreoffice-help-en-us"
RU_PACKAGE = "libreoffice-help-ru"
LIBREOFFICE_PACKAGES = (EN_PACKAGE, RU_PACKAGE)
HELP_ROOT = Path("usr/share/libreoffice/help")
CORPUS_NAME = "libreoffice-ru-en"
WMT19_DATASET = "wmt/wmt19"  # current Hub id of the dataset formerly loaded as "wmt19"

ALTERNATIVES = (
    "Alternatives: pass your own corpus with `--data FILE.tsv` (one `source<TAB>target` pair per line), "
    'or set `data.source = "wmt19"` (needs internet access and `pip install trustformer[hf]`).'
)

_CYRILLIC = re.compile(r"[\u0400-\u0481\u048A-\u052F]")
_PARAGRAPH_ID = re.compile(r"^[A-Za-z]+_id\w*$")
_VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template"})
_CLOSES_P = frozenset(
    "address article aside blockquote div dl fieldset footer form h1 h2 h3 h4 h5 h6 header hr "
    "menu nav ol p pre section table ul".split()
)
_APT_TIMEOUT_S = 900


class CorpusUnavailableError(TrustformerError, RuntimeError):
    """A corpus cannot be obtained on this machine (missing tools, network or packages)."""


def default_cache_dir() -> Path:
    """Cache folder for built data: ``$TRUSTFORMER_CACHE`` if set, else ``~/.cache/trustformer``."""
    env = os.environ.get("TRUSTFORMER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trustformer"


# --------------------------------------------------------------------------------------------------
# TSV files


def load_tsv(path: str | os.PathLike[str]) -> list[Pair]:
    """Read a strict UTF-8 TSV corpus, one ``source<TAB>target`` pair per line (see ``load_tsv_domains``;
    a domain column, if any, is dropped)."""
    return load_tsv_domains(path)[0]


def check_corpus_file(path: Path) -> None:
    """A corpus path must name a readable file (ValueError saying what it names instead)."""
    if path.is_dir():
        raise ValueError(
            f"{path} is a folder: --data (data.path) takes one TSV file of `source<TAB>target` "
            "lines (optionally `<TAB>domain`); to use several files, concatenate them"
        )
    if not path.exists():
        raise ValueError(f"{path} does not exist: --data (data.path) takes a TSV file of `source<TAB>target` lines")


def load_tsv_domains(path: str | os.PathLike[str]) -> tuple[list[Pair], list[str] | None]:
    """Read a strict UTF-8 TSV corpus: ``source<TAB>target`` per line, or ``source<TAB>target<TAB>domain``
    on every line (the domain names the part of the corpus a pair comes from, e.g. a help module).

    Returns the pairs and, for a file with the domain column, the domain of each pair (else ``None``).
    Blank lines are skipped. A line with the wrong number of tabs (or a different number than the first
    line), an empty field, or invalid UTF-8 raises ``ValueError`` naming the file and the 1-based line
    number; so does a file with no pairs at all.
    """
    path = Path(path)
    check_corpus_file(path)
    pairs: list[Pair] = []
    domains: list[str] = []
    columns: int | None = None
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            fields = _parse_tsv_line(raw, path, number, columns)
            if fields is None:
                continue
            columns = len(fields)
            pairs.append((fields[0], fields[1]))
            if columns == 3:
                domains.append(fields[2])
    if not pairs:
        raise ValueError(f"{path}: no pairs found (expected one `source<TAB>target` per line)")
    return pairs, (domains if columns == 3 else None)


def _parse_tsv_line(raw: bytes, path: Path, number: int, columns: int | None) -> tuple[str, ...] | None:
    """Parse one TSV line into 2 or 3 fields (``columns``: what earlier lines had); ``None`` for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}, line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    line = line.rstrip("\r\n")
    if not line.strip():
        return None
    tabs = line.count("\t")
    if tabs not in (1, 2) or (columns is not None and tabs != columns - 1):
        expected = {
            None: "exactly one tab between source and target (or two, with a domain column on every line)",
            2: "exactly one tab between source and target, like the lines before",
            3: "two tabs (source, target, domain), like the lines before",
        }[columns]
        raise ValueError(f"{path}, line {number}: expected {expected}, found {tabs}")
    fields = tuple(side.strip() for side in line.split("\t"))
    for name, text in zip(("source", "target", "domain"), fields):
        if not text:
            raise ValueError(
                f"{path}, line {number}: empty {name} side"
                if name != "domain"
                else f"{path}, line {number}: empty domain column"
            )
    return fields


def write_tsv(pairs: Iterable[Pair], path: str | os.PathLike[str], domains: Sequence[str] | None = None) -> None:
    """Write pairs (and a third ``domain`` column when ``domains`` is given) as UTF-8 TSV atomically."""
    path = Path(path)
    pairs = list(pairs)
    if domains is not None and len(domains) != len(pairs):
        raise ValueError(f"{len(domains)} domains for {len(pairs)} pairs")
    lines = []
    for i, (source, target) in enumerate(pairs):
        fields = (source, target) if domains is None else (source, target, domains[i])
        if any(ch in text for text in fields for ch in "\t\n\r") or not all(fields):
            raise ValueError(
                f"pair contains a tab or newline, or an empty field, and cannot be written as TSV: {source!r}"
            )
        lines.append("\t".join(fields) + "\n")
    _write_atomic(path, "".join(lines))


def _write_atomic(path: Path, text: str) -> None:
    """Write text to ``path`` through a temporary file in the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------------
# LibreOffice help corpus


def load_libreoffice_corpus(cache_dir: Path | None = None, *, progress: Progress | None = None) -> list[Pair]:
    """Russian→English pairs aligned from Debian's LibreOffice help packages (see
    ``load_libreoffice_domains``, which also returns each pair's help module)."""
    return load_libreoffice_domains(cache_dir, progress=progress)[0]


def load_libreoffice_domains(
    cache_dir: Path | None = None, *, progress: Progress | None = None
) -> tuple[list[Pair], list[str]]:
    """Russian→English pairs aligned from Debian's LibreOffice help packages, and the help module
    (``HELP_MODULES``: writer, calc, impress, draw, base, math, basic, chart, shared) of each pair.

    The first call downloads ``libreoffice-help-en-us`` and ``libreoffice-help-ru`` with
    ``apt-get download``, unpacks them with ``dpkg-deb -x``, aligns the help paragraphs and caches the
    result as ``<cache_dir>/libreoffice-ru-en/<version>/pairs.tsv`` (``source<TAB>target<TAB>module``, with
    ``LICENSE-NOTICE.txt``). Later calls read the cache and never call apt. The result is deduplicated and
    sorted, so it is identical on every machine for the same package version.

    Raises ``CorpusUnavailableError`` when the packages cannot be obtained.
    """
    report = progress or (lambda message: logger.info("%s", message))
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    corpus_root = root / CORPUS_NAME
    cached = _find_cached_corpus(corpus_root)
    if cached is not None:
        report(f"using cached corpus {cached}")
        pairs, domains = load_tsv_domains(cached)
        assert domains is not None  # _find_cached_corpus keeps files with the domain column only
        return pairs, domains
    return _build_libreoffice_corpus(corpus_root, report)


def _find_cached_corpus(corpus_root: Path) -> Path | None:
    """The cached ``pairs.tsv`` of the highest package version, if any (one written before the
    module column existed is ignored, and rebuilt)."""
    candidates = [p for p in corpus_root.glob("*/pairs.tsv") if p.is_file() and _has_domain_column(p)]
    if not candidates:
        return None
    return max(candidates, key=lambda p: _natural_key(p.parent.name))


def _has_domain_column(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.readline().count(b"\t") == 2


def _natural_key(text: str) -> list[tuple[int, int | str]]:
    """Sort key that orders embedded numbers numerically (``7.10`` after ``7.9``)."""
    return [(0, int(tok)) if tok.isdigit() else (1, tok) for tok in re.findall(r"\d+|\D+", text)]


def _build_libreoffice_corpus(corpus_root: Path, report: Progress) -> tuple[list[Pair], list[str]]:
    """Download, unpack and align the help packages; write the cache; return the pairs and modules."""
    _require_tools()
    corpus_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=corpus_root, prefix=".build-") as tmp:
        work = Path(tmp)
        report(f"downloading {' and '.join(LIBREOFFICE_PACKAGES)} with apt-get…")
        debs = _apt_download(LIBREOFFICE_PACKAGES, work)
        versions = {name: _deb_version(deb) for name, deb in debs.items()}
        target_dir = corpus_root / _version_folder(versions)
        if (target_dir / "pairs.tsv").is_file() and _has_domain_column(target_dir / "pairs.tsv"):
            report(f"using cached corpus {target_dir / 'pairs.tsv'}")  # built meanwhile by another process
            pairs, domains = load_tsv_domains(target_dir / "pairs.tsv")
            return pairs, domains or []
        report("extracting help pages…")
        for deb in debs.values():
            _run(["dpkg-deb", "-x", str(deb), str(work / "tree")], what=f"unpacking {deb.name}")
        help_root = work / "tree" / HELP_ROOT
        triples = align_help_modules(help_root / "ru", help_root / "en-US")
        if not triples:
            raise CorpusUnavailableError(
                f"no aligned pairs found under {HELP_ROOT} in the unpacked packages. {ALTERNATIVES}"
            )
        pairs = [(ru, en) for ru, en, _ in triples]
        domains = [module for _, _, module in triples]
        report(f"aligned {len(pairs)} pairs")
        _write_atomic(target_dir / "LICENSE-NOTICE.txt", _license_notice(versions, len(pairs)))
        write_tsv(pairs, target_dir / "pairs.tsv", domains)
        report(f"wrote {target_dir / 'pairs.tsv'}")
    return pairs, domains


def _require_tools() -> None:
    """Fail early when apt-get or dpkg-deb is missing."""
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise CorpusUnavailableError(
            f"cannot build the LibreOffice help corpus: {', '.join(missing)} not found "
            f"(a Debian or Ubuntu system with apt is needed). {ALTERNATIVES}"
        )


def _run(
    cmd: list[str],
    *,
    what: str,
    cwd: Path | None = None,
    hint: Callable[[str], str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise ``CorpusUnavailableError`` with its stderr tail (and a hint)."""
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_APT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CorpusUnavailableError(f"{what} failed: {exc}. {ALTERNATIVES}") from exc
    if result.returncode != 0:
        output = result.stderr or result.stdout or ""
        extra = hint(output) if hint else ""
        raise CorpusUnavailableError(
            f"{what} failed (`{' '.join(cmd)}` exited with {result.returncode}): {_tail(output)}.{extra} {ALTERNATIVES}"
        )
    return result


def _tail(text: str, lines: int = 6) -> str:
    """Last few non-empty lines of a command's output, joined on one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(no output)"


_STALE_LISTS = re.compile(
    r"Unable to locate package|has no installation candidate|Can't select candidate|"
    r"Can't select versions?|No packages found|404\s+Not Found",
    re.IGNORECASE,
)


def _stale_lists_hint(output: str) -> str:
    """Suggest ``apt-get update`` when apt did not find the package (or its file)."""
    if _STALE_LISTS.search(output) is None:
        return ""
    return (
        " The package was not found: the apt package lists are probably missing or stale; "
        "run `apt-get update` (as root) and try again."
    )


def _apt_download(packages: Sequence[str], dest: Path) -> dict[str, Path]:
    """``apt-get download`` the packages into ``dest``; map package name to its .deb file."""
    cmd = ["apt-get", "download"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd += ["-o", "APT::Sandbox::User=root"]  # the private temp folder is not readable by _apt
    cmd += list(packages)
    _run(cmd, what=f"downloading {', '.join(packages)}", cwd=dest, hint=_stale_lists_hint)
    debs: dict[str, Path] = {}
    for name in packages:
        found = sorted(dest.glob(f"{name}_*.deb"))
        if not found:
            raise CorpusUnavailableError(
                f"apt-get download reported success but no {name}_*.deb appeared in the download folder. {ALTERNATIVES}"
            )
        debs[name] = found[-1]
    return debs


def _deb_version(deb: Path) -> str:
    """The ``Version`` field of a .deb file."""
    result = _run(["dpkg-deb", "--field", str(deb), "Version"], what=f"reading the version of {deb.name}")
    return result.stdout.strip()


def _version_folder(versions: dict[str, str]) -> str:
    """Folder name for a package version: filesystem-safe (``:`` becomes ``_``)."""
    distinct = sorted(set(versions.values()))
    label = distinct[0] if len(distinct) == 1 else "+".join(f"{name}={versions[name]}" for name in sorted(versions))
    return re.sub(r"[^A-Za-z0-9.+~=-]", "_", label)


def _license_notice(versions: dict[str, str], n_pairs: int) -> str:
    """Attribution kept beside the built corpus."""
    package_lines = "\n".join(f"  {name} {versions[name]}" for name in sorted(versions))
    return (
        "LibreOffice help Russian-English parallel corpus\n"
        "=================================================\n\n"
        f"{n_pairs} sentence pairs aligned from the LibreOffice help pages shipped in the Debian packages:\n"
        f"{package_lines}\n\n"
        "The LibreOffice help content is Copyright (c) The Document Foundation and its contributors,\n"
        "licensed under the Mozilla Public License, v. 2.0 (MPL-2.0).\n"
        "A copy of the MPL-2.0 is available at https://mozilla.org/MPL/2.0/.\n"
        "Source: https://www.libreoffice.org/ (help content: https://help.libreoffice.org/).\n\n"
        "pairs.tsv was derived by extracting the visible text of help paragraphs that carry the same\n"
        "element id in the Russian and English pages. It is redistributed under the same licence.\n"
    )


# --------------------------------------------------------------------------------------------------
# Help page parsing and alignment


class _HelpPageParser(HTMLParser):
    """Collect the visible text of elements whose id looks like ``par_id…`` or ``hd_id…``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._stack: list[str] = []
        self._hidden: list[int] = []  # stack depths of open hidden elements
        self._open: list[tuple[int, str, list[str]]] = []  # (depth, id, text chunks)
        self.paragraphs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID_TAGS:
            if tag == "br":
                self._add_text(" ")
            return
        if tag in _CLOSES_P and self._stack and self._stack[-1] == "p":
            self._close_from(len(self._stack) - 1)
        depth = len(self._stack)
        self._stack.append(tag)
        attributes = dict(attrs)
        element_id = attributes.get("id") or ""
        if tag in _SKIPPED_TAGS or _is_hidden(attributes, element_id):
            self._hidden.append(depth)
        if _PARAGRAPH_ID.match(element_id):
            self._open.append((depth, element_id, []))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self._add_text(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID_TAGS or tag not in self._stack:
            return
        depth = len(self._stack) - 1 - self._stack[::-1].index(tag)
        self._close_from(depth)

    def handle_data(self, data: str) -> None:
        self._add_text(data)

    def close(self) -> None:
        super().close()
        self._close_from(0)

    def _add_text(self, text: str) -> None:
        if self._hidden:
            return
        for _, _, chunks in self._open:
            chunks.append(text)

    def _close_from(self, depth: int) -> None:
        """Close every open element at stack depth ``depth`` or deeper."""
        del self._stack[depth:]
        self._hidden = [d for d in self._hidden if d < depth]
        while self._open and self._open[-1][0] >= depth:
            _, element_id, chunks = self._open.pop()
            self.paragraphs.append((element_id, " ".join("".join(chunks).split())))


def _is_hidden(attributes: dict[str, str | None], element_id: str) -> bool:
    """Hidden alternatives are not shown, except the ``default…`` one the help viewer displays."""
    return "hidden" in attributes and not element_id.startswith("default")


def extract_help_paragraphs(html: str) -> dict[tuple[str, int], str]:
    """Map (element id, occurrence index) to whitespace-normalised visible text of one help page."""
    parser = _HelpPageParser()
    parser.feed(html)
    parser.close()
    seen: dict[str, int] = {}
    out: dict[tuple[str, int], str] = {}
    for element_id, text in parser.paragraphs:
        occurrence = seen.get(element_id, 0)
        seen[element_id] = occurrence + 1
        out[(element_id, occurrence)] = text
    return out


HELP_MODULES = {
    "swriter": "writer",
    "scalc": "calc",
    "simpress": "impress",
    "sdraw": "draw",
    "sdatabase": "base",
    "smath": "math",
    "sbasic": "basic",
    "schart": "chart",
    "shared": "shared",
}
"""Help folders (``text/<folder>/``) and the module name a pair from them is labelled with."""


def help_module(relative: Path) -> str:
    """The LibreOffice module of a help page, from its path under the language folder
    (``text/scalc/01/…`` → ``calc``); pages outside ``text/<module>/`` are ``other``."""
    parts = relative.parts
    if len(parts) >= 3 and parts[0] == "text":
        return HELP_MODULES.get(parts[1], parts[1])
    return "other"


def align_help_trees(ru_root: Path, en_root: Path) -> list[Pair]:
    """Align the help pages of two language folders into sorted, deduplicated (ru, en) pairs."""
    return [(ru, en) for ru, en, _ in align_help_modules(ru_root, en_root)]


def align_help_modules(ru_root: Path, en_root: Path) -> list[tuple[str, str, str]]:
    """Sorted, deduplicated (ru, en, module) triples; a pair found in several modules' pages keeps the
    module of its first page in path order."""
    if not ru_root.is_dir() or not en_root.is_dir():
        raise CorpusUnavailableError(
            f"help folders not found after unpacking ({ru_root.name}, {en_root.name} under {HELP_ROOT}). {ALTERNATIVES}"
        )
    modules: dict[Pair, str] = {}
    for relative in sorted(p.relative_to(en_root) for p in en_root.rglob("*.html")):
        ru_page = ru_root / relative
        if not ru_page.is_file():
            continue
        en_par = extract_help_paragraphs((en_root / relative).read_text(encoding="utf-8", errors="replace"))
        ru_par = extract_help_paragraphs(ru_page.read_text(encoding="utf-8", errors="replace"))
        module = help_module(relative)
        for key in sorted(en_par.keys() & ru_par.keys()):
            pair = (ru_par[key], en_par[key])
            if _keep_pair(pair):
                modules.setdefault(pair, module)
    return sorted((ru, en, module) for (ru, en), module in modules.items())


def _keep_pair(pair: Pair) -> bool:
    """Drop empty, untranslated (ru == en) and non-Cyrillic Russian sides."""
    ru, en = pair
    return bool(ru) and bool(en) and ru != en and _CYRILLIC.search(ru) is not None


# --------------------------------------------------------------------------------------------------
# WMT19 through Hugging Face datasets


def load_wmt19(
    split: str = "train",
    *,
    limit: int | None = None,
    data_files: str | Sequence[str] | None = None,
    source_lang: str = "ru",
    target_lang: str = "en",
) -> list[Pair]:
    """WMT19 pairs through Hugging Face ``datasets``.

    Without ``data_files`` the ``ru-en`` configuration is read from the Hugging Face Hub (needs
    internet; with ``limit`` it is streamed, so only the first rows are fetched). With ``data_files``,
    local JSON / JSON-lines / Parquet / CSV files in the same row shape are read instead: each row holds
    a ``translation`` dict such as ``{"ru": "...", "en": "..."}``. Rows with an empty side are skipped.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    datasets = _import_datasets()
    if data_files is not None:
        rows = _local_rows(datasets, data_files, split)
    else:
        config = _wmt19_config(source_lang, target_lang)
        rows = _hub_rows(datasets, config, split, streaming=limit is not None)
    pairs = _rows_to_pairs(rows, source_lang, target_lang, limit)
    if data_files is not None and not pairs:
        raise ValueError(f"no {source_lang}-{target_lang} pairs found in {data_files!r}")
    return pairs


def _import_datasets() -> Any:
    """Import ``datasets`` lazily, naming the optional extra when it is missing."""
    try:
        import datasets
    except ImportError as exc:
        raise CorpusUnavailableError(
            "WMT19 needs the Hugging Face `datasets` package: pip install trustformer[hf]. "
            f"Or use the default LibreOffice corpus or `--data FILE.tsv`. ({exc})"
        ) from exc
    return datasets


def _local_rows(datasets: Any, data_files: str | Sequence[str], split: str) -> Iterator[dict]:
    """Rows of local files, read with the builder their extension names."""
    files = [str(data_files)] if isinstance(data_files, (str, os.PathLike)) else [str(f) for f in data_files]
    if not files:
        raise ValueError("data_files is empty")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"WMT19-format data file(s) not found: {', '.join(missing)}")
    builder = _builder_for(files)
    with tempfile.TemporaryDirectory(prefix="trustformer-hf-") as cache:
        dataset = datasets.load_dataset(builder, data_files={split: files}, split=split, cache_dir=cache)
        rows = list(dataset)
    return iter(rows)


def _builder_for(files: Sequence[str]) -> str:
    """The ``datasets`` packaged builder for the files' extension."""
    kinds = set()
    for name in files:
        lower = name.lower().removesuffix(".gz").removesuffix(".bz2").removesuffix(".xz")
        suffix = lower.rsplit(".", 1)[-1] if "." in lower else ""
        kinds.add({"json": "json", "jsonl": "json", "parquet": "parquet", "csv": "csv"}.get(suffix))
    if None in kinds or len(kinds) != 1:
        raise ValueError(f"data_files must all be .json/.jsonl, .parquet or .csv files of one kind, got {list(files)}")
    return kinds.pop()


def _wmt19_config(source_lang: str, target_lang: str) -> str:
    """WMT19 configurations pair a language with English, named ``xx-en`` (e.g. ``ru-en``)."""
    langs = {source_lang, target_lang}
    if "en" not in langs or len(langs) != 2:
        raise ValueError(f"WMT19 pairs English with another language, got {source_lang}->{target_lang}")
    (other,) = langs - {"en"}
    return f"{other}-en"


def _hub_rows(datasets: Any, config: str, split: str, *, streaming: bool) -> Iterable[dict]:
    """Rows of WMT19 from the Hub, turning failures into ``CorpusUnavailableError``."""
    try:
        return datasets.load_dataset(WMT19_DATASET, config, split=split, streaming=streaming)
    except Exception as exc:  # noqa: BLE001 - network, hub and cache errors come in many types
        raise CorpusUnavailableError(
            f"could not load {WMT19_DATASET} ({config}, split {split!r}) from the Hugging Face Hub: "
            f"{type(exc).__name__}: {exc}. The Hub needs network access (or a filled Hugging Face cache "
            "with HF_DATASETS_OFFLINE=1). Alternatively pass local files with data_files=..., use the "
            "default LibreOffice corpus, or `--data FILE.tsv`."
        ) from exc


def _rows_to_pairs(rows: Iterable[dict], source_lang: str, target_lang: str, limit: int | None) -> list[Pair]:
    """Extract (source, target) pairs from rows in the WMT19 shape."""
    pairs: list[Pair] = []
    if limit == 0:
        return pairs
    for index, row in enumerate(rows):
        translation = row.get("translation", row)
        if not isinstance(translation, dict) or source_lang not in translation or target_lang not in translation:
            raise ValueError(
                f"row {index} is not in the WMT19 shape: expected a 'translation' dict with "
                f"{source_lang!r} and {target_lang!r} keys, got keys {sorted(row)}"
            )
        source = " ".join(str(translation[source_lang] or "").split())
        target = " ".join(str(translation[target_lang] or "").split())
        if source and target:
            pairs.append((source, target))
            if limit is not None and len(pairs) >= limit:
                break
    return pairs
