"""``trustformer translate`` and ``trustformer predict``: use a finished run's model folders (``export.py``) on new
sentences or image files (decoded and normalised by ``image_files.py``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

import torch

from . import TASK_CLASSIFICATION, ExportError, load_image_model, load_translation_model, select_model
from .format import SUMMARY_FILE
from .image_files import MASK_SUFFIX, classification_input, image_files, read_image, segmentation_input

DEFAULT_BEAM = 4  # `trustformer translate --beam`
DEFAULT_TRANSLATE_BATCH = 32  # sentences decoded together by `trustformer translate`

__all__ = [
    "DEFAULT_BEAM",
    "DEFAULT_TRANSLATE_BATCH",
    "add_predict_parser",
    "add_translate_parser",
    "cmd_predict",
    "cmd_translate",
    "empty_translation_warning",
    "run_preset",
]


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ExportError("--device cuda, but this process sees no CUDA device (use --device cpu)")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise ExportError(f"--device {name!r}: {exc}") from exc


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run",
        required=True,
        metavar="DIR",
        help="a finished run folder (the --out of `trustformer run`, holding summary.json and models/)",
    )
    p.add_argument(
        "--client", type=int, metavar="K", help="use client K's final model (default: the lowest client id of the run)"
    )
    p.add_argument("--device", default="cpu", metavar="DEV", help="cpu (default), cuda or auto")


def add_translate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``trustformer translate``; its handler is :func:`cmd_translate` (``args.func``)."""
    p = sub.add_parser(
        "translate",
        help="translate Russian sentences into English with a run's trained model",
        description="Translate with the final model of one client of a finished run. The sentences are the "
        "TEXT arguments, or, with none, the lines of standard input (one sentence per line, translated in "
        f"batches of {DEFAULT_TRANSLATE_BATCH} as they arrive). One translation is printed per sentence, in "
        "order, one per line; an empty input line gives an empty output line.",
    )
    _common_options(p)
    p.add_argument(
        "--beam",
        type=_positive("--beam"),
        default=DEFAULT_BEAM,
        metavar="N",
        help=f"beam size; 1 is greedy decoding (default {DEFAULT_BEAM})",
    )
    p.add_argument(
        "--max-len",
        type=_positive("--max-len"),
        default=None,
        metavar="L",
        help="at most L tokens per source (longer ones are truncated) and per translation "
        "(default: the model's max_len, the length it was trained with)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive("--batch-size"),
        default=DEFAULT_TRANSLATE_BATCH,
        metavar="B",
        help=f"sentences decoded together (default {DEFAULT_TRANSLATE_BATCH})",
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="sentences to translate (default: read stdin)")
    p.set_defaults(func=cmd_translate)
    return p


def _clean_line(text: str) -> str:
    return " ".join(text.split())


def _stdin_batches(stream: IO[str], size: int) -> Iterator[list[str]]:
    """Lines of ``stream`` in batches of at most ``size``; a batch is also cut short when no further
    input is waiting, so an interactive user gets each translation after its line."""
    batch: list[str] = []
    for line in stream:
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= size or not _more_input_waiting(stream):
            yield batch
            batch = []
    if batch:
        yield batch


def _more_input_waiting(stream: IO[str]) -> bool:
    try:
        import select

        fd = stream.fileno()
    except (AttributeError, OSError, ValueError, ImportError):  # e.g. io.StringIO: all of it is there
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _emit(lines: Iterable[str]) -> None:
    out = sys.stdout
    for line in lines:
        out.write(line + "\n")
    out.flush()


def run_preset(run_dir: Path) -> str | None:
    """The preset of the run in ``run_dir`` (its ``summary.json``'s configuration), None when it does not say."""
    try:
        config = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return None
    preset = config.get("preset") if isinstance(config, dict) else None
    return preset if isinstance(preset, str) else None


def empty_translation_warning(line: int, preset: str | None) -> str:
    """The warning of an empty translation of input line ``line`` (1-based) by a model of a run of ``preset``."""
    why = (
        "runs of the tiny preset are too small to translate (it is for tests and smoke runs) — use --preset small"
        if preset == "tiny"
        else "the model is likely undertrained (train longer: --rounds, or use a larger --preset)"
    )
    return f"trustformer translate: warning: the model produced an empty translation for line {line}; {why}"


def cmd_translate(args: argparse.Namespace) -> int:
    """``trustformer translate``: print one translation per input sentence, in order; a warning on stderr at the
    first empty translation of a sentence, and how many there were at the end."""
    from ..evaluation.translation import translate

    client, folder = select_model(Path(args.run), args.client)
    model, tokenizer, meta = load_translation_model(folder, device=_device(getattr(args, "device", "cpu")))
    max_len = args.max_len or model.config.max_len
    if max_len < 2:
        raise ExportError(f"--max-len must be >= 2, got {max_len}")
    batch_size = getattr(args, "batch_size", DEFAULT_TRANSLATE_BATCH) or DEFAULT_TRANSLATE_BATCH
    seen = {"lines": 0, "sentences": 0, "empty": 0}

    def run(batch: list[str]) -> list[str]:
        cleaned = [_clean_line(text) for text in batch]
        todo = [text for text in cleaned if text]
        done = (
            iter(translate(model, tokenizer, todo, batch_size=batch_size, max_len=max_len, beam_size=args.beam))
            if todo
            else iter(())
        )
        out = [_clean_line(next(done)) if text else "" for text in cleaned]
        for number, (text, hypothesis) in enumerate(zip(cleaned, out, strict=True), start=seen["lines"] + 1):
            if text and not hypothesis:
                seen["empty"] += 1
                if seen["empty"] == 1:
                    print(empty_translation_warning(number, run_preset(Path(args.run))), file=sys.stderr, flush=True)
        seen["lines"] += len(cleaned)
        seen["sentences"] += len(todo)
        return out

    try:
        if args.texts:
            for start in range(0, len(args.texts), batch_size):
                _emit(run(list(args.texts[start : start + batch_size])))
        else:
            if sys.stdin.isatty():
                print(
                    f"trustformer translate: client {client}'s model ({meta.get('fingerprint')}); type one "
                    "Russian sentence per line, Ctrl-D to end",
                    file=sys.stderr,
                    flush=True,
                )
            for batch in _stdin_batches(sys.stdin, batch_size):
                _emit(run(batch))
    except BrokenPipeError:  # e.g. `| head`: the reader is gone; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    if seen["empty"] > 1:
        print(
            f"trustformer translate: warning: {seen['empty']} of {seen['sentences']} translations were empty",
            file=sys.stderr,
        )
    return 0


# ------------------------------------------------------------------------------------ predict


def add_predict_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``trustformer predict``; its handler is :func:`cmd_predict` (``args.func``)."""
    p = sub.add_parser(
        "predict",
        help="classify images or segment them with a run's trained image model",
        description="Use the final model of one client of a finished image-classification or segmentation "
        "run on image files (PNG, JPEG, …) or folders of them (searched recursively). Images are converted "
        "to the training data's channels and size and normalised as in training. Classification prints "
        "`path<TAB>class<TAB>probability` per image; segmentation writes `<name>.mask.png` (0/255, the "
        "input's size) beside each image (or into --out) and prints `path<TAB>mask<TAB>foreground fraction`.",
    )
    _common_options(p)
    p.add_argument("--out", metavar="DIR", help="segmentation: write the masks here (default: beside each image)")
    p.add_argument(
        "--threshold",
        type=float,
        metavar="P",
        help="segmentation: foreground probability threshold (default: the run's)",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files or folders")
    p.set_defaults(func=cmd_predict)
    return p


def _mask_path(image: Path, out_dir: Path | None) -> Path:
    name = image.name
    stem = name[: -len(image.suffix)] if image.suffix else name
    return (out_dir or image.parent) / f"{stem}{MASK_SUFFIX}"


def cmd_predict(args: argparse.Namespace) -> int:
    """``trustformer predict``: classify or segment image files; 1 when some image could not be read."""
    import numpy as np
    import torch.nn.functional as F

    _, folder = select_model(Path(args.run), args.client)
    device = _device(getattr(args, "device", "cpu"))
    model, meta = load_image_model(folder, device=device)
    spec = meta["input"]
    files = image_files(args.paths)
    failed = 0
    if meta["task"] == TASK_CLASSIFICATION:
        classes = spec["classes"]
        for start in range(0, len(files), 64):
            chunk, inputs = [], []
            for path in files[start : start + 64]:
                try:
                    inputs.append(classification_input(read_image(path, spec["channels"]), spec))
                    chunk.append(path)
                except ExportError as exc:
                    print(f"trustformer predict: {exc}", file=sys.stderr)
                    failed += 1
            if not chunk:
                continue
            with torch.no_grad():
                probs = torch.softmax(model(torch.cat(inputs).to(device)).float(), dim=1).cpu()
            best_p, best = probs.max(dim=1)
            _emit(f"{path}\t{classes[int(k)]}\t{float(p):.4f}" for path, k, p in zip(chunk, best, best_p, strict=True))
        return 1 if failed else 0
    given = getattr(args, "threshold", None)
    threshold = spec["threshold"] if given is None else float(given)
    if not 0.0 < threshold < 1.0:
        raise ExportError(f"--threshold must be in (0, 1), got {threshold}")
    out_dir = Path(args.out) if getattr(args, "out", None) else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    for path in files:
        try:
            image = read_image(path, spec["channels"])
        except ExportError as exc:
            print(f"trustformer predict: {exc}", file=sys.stderr)
            failed += 1
            continue
        with torch.no_grad():
            prob = torch.sigmoid(model(segmentation_input(image, spec).to(device)).float()).cpu()
        prob = (
            F.interpolate(prob, size=tuple(image.shape[-2:]), mode="bilinear", align_corners=False)
            if tuple(prob.shape[-2:]) != tuple(image.shape[-2:])
            else prob
        )
        mask = (prob[0, 0] > threshold).numpy()
        target = _mask_path(path, out_dir)
        Image.fromarray((mask * 255).astype(np.uint8)).save(target)
        _emit([f"{path}\t{target}\t{float(mask.mean()):.4f}"])
    return 1 if failed else 0
