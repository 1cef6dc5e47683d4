"""METEOR (Banerjee & Lavie 2005) with WordNet synonym matching, computed offline with NLTK.

NLTK's ``meteor_score`` matches words exactly, then by Porter stem, then by WordNet synonym. It
needs the WordNet 3.0 database, which ``nltk.download`` would fetch from the internet: we never do
that. Instead the database comes from Debian's packages ``wordnet-base`` and
``wordnet-sense-index`` (``/usr/share/wordnet``), or from any folder named by ``$WNSEARCHDIR`` /
``$WNHOME/dict``, or from an NLTK data folder that already holds ``corpora/wordnet``.

NLTK's reader also wants a ``lexnames`` file that Debian does not ship: the 45-line table of
lexicographer file names from the lexnames(5WN) manual. :func:`wordnet_folder` builds, once, a
folder in the cache (``$TRUSTFORMER_CACHE/nltk_data/corpora/wordnet``) holding the database files
plus that table; no root access is needed for it.

Sentences are tokenized with sacreBLEU's ``13a`` tokenizer (the one BLEU uses) and lower-cased.
The corpus score is the mean of the sentence scores (0–1), as most toolkits report METEOR.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import warnings
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from ..errors import TrustformerError

log = logging.getLogger(__name__)

__all__ = [
    "DEBIAN_PACKAGES",
    "WordNetUnavailableError",
    "find_wordnet_database",
    "wordnet_folder",
    "load_wordnet",
    "tokenize",
    "sentence_meteor",
    "corpus_meteor",
]

DEBIAN_PACKAGES = ("wordnet-base", "wordnet-sense-index")
# Files NLTK's WordNetCorpusReader reads (index.sense only for sense keys; cntlist.rev for counts).
REQUIRED_FILES = tuple(f"{kind}.{pos}" for kind in ("index", "data") for pos in ("noun", "verb", "adj", "adv"))
OPTIONAL_FILES = ("adj.exc", "adv.exc", "noun.exc", "verb.exc", "index.sense", "cntlist.rev")

# lexnames(5WN): file number, lexicographer file name, syntactic category (1 noun, 2 verb, 3 adj, 4 adv)
_LEXNAMES = [
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
]
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
LEXNAMES = "".join(f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(_LEXNAMES))
assert len(_LEXNAMES) == 45


class WordNetUnavailableError(TrustformerError, RuntimeError):
    """The WordNet database METEOR needs is not installed; the message says how to install it."""


def _is_database(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def find_wordnet_database() -> tuple[Path, bool] | None:
    """The first folder holding the WordNet 3.0 database files, and whether NLTK can read it as is.

    Looked up in order: NLTK's data path (``corpora/wordnet`` with its ``lexnames``; never
    downloaded), ``$WNSEARCHDIR``, ``$WNHOME/dict``, Debian's ``/usr/share/wordnet``, then the
    WordNet default install ``/usr/local/WordNet-3.0/dict``. None when there is none.
    """
    import nltk.data

    for root in nltk.data.path:
        folder = Path(root) / "corpora" / "wordnet"
        if _is_database(folder) and (folder / "lexnames").is_file():
            return folder, True
    candidates: list[Path] = []
    if os.environ.get("WNSEARCHDIR"):
        candidates.append(Path(os.environ["WNSEARCHDIR"]))
    if os.environ.get("WNHOME"):
        candidates.append(Path(os.environ["WNHOME"]) / "dict")
    candidates += [Path("/usr/share/wordnet"), Path("/usr/local/WordNet-3.0/dict")]
    for folder in candidates:
        if _is_database(folder):
            return folder, False
    return None


def _missing_message() -> str:
    packages = " ".join(DEBIAN_PACKAGES)
    return (
        "METEOR needs the WordNet 3.0 database and none was found (looked in NLTK's data path, "
        "$WNSEARCHDIR, $WNHOME/dict and /usr/share/wordnet). Install Debian's packages "
        f"{' and '.join(DEBIAN_PACKAGES)}: 'apt-get install {packages}' (scripts/install.sh does it when "
        "run as root), or point $WNSEARCHDIR at a folder holding WordNet's index.* and data.* files. "
        "Or switch METEOR off with --set eval.meteor=false."
    )


def wordnet_folder(cache_dir: str | Path | None = None) -> Path:
    """A folder NLTK's WordNet reader accepts: the database plus ``lexnames``, built once in the cache.

    The database is copied once (about 35 MB) to ``<cache>/nltk_data/corpora/wordnet`` (NLTK refuses
    to read through symbolic or hard links to files outside its data path), and ``<cache>/nltk_data``
    is added to ``nltk.data.path``. Raises
    :class:`WordNetUnavailableError`, naming the Debian packages, when no database is found.
    """
    import nltk.data

    found = find_wordnet_database()
    if found is None:
        raise WordNetUnavailableError(_missing_message())
    source, readable = found
    if readable:
        return source
    if cache_dir is None:
        from ..data.corpus import default_cache_dir

        cache_dir = default_cache_dir()
    data_root = Path(cache_dir).expanduser().resolve() / "nltk_data"
    if str(data_root) not in [str(p) for p in nltk.data.path]:
        nltk.data.path.append(str(data_root))
    target = data_root / "corpora" / "wordnet"
    marker = target / "SOURCE"
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == str(source) and _is_database(target):
        return target
    tmp = target.with_name(f"wordnet.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in REQUIRED_FILES + OPTIONAL_FILES:
        src = source / name
        if not src.is_file():
            continue
        shutil.copyfile(src, tmp / name)
    (tmp / "lexnames").write_text(LEXNAMES, encoding="utf-8")
    (tmp / "README").write_text(
        "WordNet 3.0 (Princeton University, WordNet 3.0 licence), laid out for NLTK: the files of\n"
        f"{source} plus the lexnames table of the lexnames(5WN) manual.\n",
        encoding="utf-8",
    )
    (tmp / "SOURCE").write_text(f"{source}\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("WordNet for METEOR: %s (from %s)", target, source)
    return target


_load_lock = threading.Lock()


@lru_cache(maxsize=2)
def _reader(folder: str):
    from nltk.corpus.reader import WordNetCorpusReader
    from nltk.data import FileSystemPathPointer

    class _EnglishWordNet(WordNetCorpusReader):
        """NLTK's reader without the WordNet-version mapping that only the Open Multilingual
        WordNet uses (it reads index.sense twice, most of the loading time)."""

        def map_wn(self, version="wordnet"):
            return None

    with warnings.catch_warnings():  # "multilingual functions are not available": no Open Multilingual WordNet
        warnings.simplefilter("ignore", UserWarning)
        return _EnglishWordNet(FileSystemPathPointer(folder), None)


def load_wordnet(cache_dir: str | Path | None = None):
    """NLTK's WordNet reader on the local database (loaded once per process)."""
    with _load_lock:
        return _reader(str(wordnet_folder(cache_dir)))


def tokenize(text: str) -> list[str]:
    """sacreBLEU's 13a tokenization (as for BLEU), split on spaces."""
    return _tokenizer_13a()(text.strip()).split()


@lru_cache(maxsize=1)
def _tokenizer_13a():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def sentence_meteor(hypothesis: str, reference: str, *, wordnet=None, cache_dir: str | Path | None = None) -> float:
    """METEOR of one hypothesis against one reference (0–1; exact, stem and WordNet-synonym matches)."""
    from nltk.translate.meteor_score import single_meteor_score

    wn = wordnet if wordnet is not None else load_wordnet(cache_dir)
    hyp, ref = tokenize(hypothesis), tokenize(reference)
    if not hyp or not ref:
        return 0.0
    return float(single_meteor_score(ref, hyp, wordnet=wn))


def corpus_meteor(
    hypotheses: Sequence[str], references: Sequence[str], *, wordnet=None, cache_dir: str | Path | None = None
) -> float:
    """Mean sentence METEOR over the corpus (0–1), one reference per hypothesis."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("corpus_meteor: no sentences to score")
    wn = wordnet if wordnet is not None else load_wordnet(cache_dir)
    scores = [sentence_meteor(h, r, wordnet=wn) for h, r in zip(hypotheses, references, strict=True)]
    return sum(scores) / len(scores)
