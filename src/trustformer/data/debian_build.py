"""The LibreOffice help corpus built from Debian's packages: ``apt-get download``, ``dpkg-deb -x``, the help pages
aligned (``help_pages.py``), then cached as ``<cache>/libreoffice-ru-en/<version>/pairs.tsv`` with its licence
notice."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .corpus_errors import ALTERNATIVES, CorpusUnavailableError
from .help_pages import HELP_ROOT, align_help_modules
from .tsv import Pair, load_tsv_domains, write_atomic, write_tsv

Progress = Callable[[str], None]

EN_PACKAGE = "libreoffice-help-en-us"
RU_PACKAGE = "libreoffice-help-ru"
LIBREOFFICE_PACKAGES = (EN_PACKAGE, RU_PACKAGE)
CORPUS_NAME = "libreoffice-ru-en"
_APT_TIMEOUT_S = 900


def find_cached_corpus(corpus_root: Path) -> Path | None:
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


def build_libreoffice_corpus(corpus_root: Path, report: Progress) -> tuple[list[Pair], list[str]]:
    """Download, unpack and align the help packages; write the cache; return the pairs and modules."""
    require_tools()
    corpus_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=corpus_root, prefix=".build-") as tmp:
        work = Path(tmp)
        report(f"downloading {' and '.join(LIBREOFFICE_PACKAGES)} with apt-get…")
        debs = apt_download(LIBREOFFICE_PACKAGES, work)
        versions = {name: deb_version(deb) for name, deb in debs.items()}
        target_dir = corpus_root / version_folder(versions)
        if (target_dir / "pairs.tsv").is_file() and _has_domain_column(target_dir / "pairs.tsv"):
            report(f"using cached corpus {target_dir / 'pairs.tsv'}")  # built meanwhile by another process
            pairs, domains = load_tsv_domains(target_dir / "pairs.tsv")
            return pairs, domains or []
        report("extracting help pages…")
        for deb in debs.values():
            run_tool(["dpkg-deb", "-x", str(deb), str(work / "tree")], what=f"unpacking {deb.name}")
        help_root = work / "tree" / HELP_ROOT
        triples = align_help_modules(help_root / "ru", help_root / "en-US")
        if not triples:
            raise CorpusUnavailableError(
                f"no aligned pairs found under {HELP_ROOT} in the unpacked packages. {ALTERNATIVES}"
            )
        pairs = [(ru, en) for ru, en, _ in triples]
        domains = [module for _, _, module in triples]
        report(f"aligned {len(pairs)} pairs")
        write_atomic(target_dir / "LICENSE-NOTICE.txt", _license_notice(versions, len(pairs)))
        write_tsv(pairs, target_dir / "pairs.tsv", domains)
        report(f"wrote {target_dir / 'pairs.tsv'}")
    return pairs, domains


def require_tools() -> None:
    """Fail early when apt-get or dpkg-deb is missing."""
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise CorpusUnavailableError(
            f"cannot build the LibreOffice help corpus: {', '.join(missing)} not found "
            f"(a Debian or Ubuntu system with apt is needed). {ALTERNATIVES}"
        )


def run_tool(
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


def apt_download(packages: Sequence[str], dest: Path) -> dict[str, Path]:
    """``apt-get download`` the packages into ``dest``; map package name to its .deb file."""
    cmd = ["apt-get", "download"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd += ["-o", "APT::Sandbox::User=root"]  # the private temp folder is not readable by _apt
    cmd += list(packages)
    run_tool(cmd, what=f"downloading {', '.join(packages)}", cwd=dest, hint=_stale_lists_hint)
    debs: dict[str, Path] = {}
    for name in packages:
        found = sorted(dest.glob(f"{name}_*.deb"))
        if not found:
            raise CorpusUnavailableError(
                f"apt-get download reported success but no {name}_*.deb appeared in the download folder. {ALTERNATIVES}"
            )
        debs[name] = found[-1]
    return debs


def deb_version(deb: Path) -> str:
    """The ``Version`` field of a .deb file."""
    result = run_tool(["dpkg-deb", "--field", str(deb), "Version"], what=f"reading the version of {deb.name}")
    return result.stdout.strip()


def version_folder(versions: dict[str, str]) -> str:
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


__all__ = [
    "CORPUS_NAME",
    "EN_PACKAGE",
    "LIBREOFFICE_PACKAGES",
    "RU_PACKAGE",
    "Progress",
    "apt_download",
    "build_libreoffice_corpus",
    "deb_version",
    "find_cached_corpus",
    "require_tools",
    "run_tool",
    "version_folder",
]
