"""Loading a run configuration: preset < ``--config FILE`` (TOML) < overrides (``--set key=value``, dotted keys),
resolved into a validated :class:`RunConfig`; and the configuration a Flower run carries."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from .checks import ConfigError, check_choice
from .coerce import build
from .presets import PRESETS, TASK_PRESETS
from .run import RunConfig, build_run
from .sections import TASKS
from .task_sections import ImageConfig, SegmentationConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


CONFIG_KEY = "trustformer-config"  # Flower run_config key holding the resolved RunConfig as JSON


def _apply_preset(merged: dict[str, Any], preset: str, task: str) -> None:
    _deep_update(merged, PRESETS[preset])
    if task in TASK_PRESETS:
        _deep_update(merged, TASK_PRESETS[task][preset])


def load_config(
    preset: str = "small",
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    used_by: Collection[str] | None = None,
) -> RunConfig:
    """Resolve preset < TOML file < overrides (dotted keys, e.g. ``federation.rounds``).

    ``used_by`` (the command line's settings, :func:`check_sections_used`): refuse a protocol's section
    (``[trustformer]``) set to other than its preset values when it is neither the run's strategy's nor one of
    ``used_by``'s (the strategies a sweep runs besides). None: no such check, for a configuration built from another
    (``cfg.flat()`` with another strategy keeps the first one's section)."""
    if preset not in PRESETS:
        raise ConfigError(f"preset = {preset!r} is not one of {', '.join(PRESETS)}")
    file_values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        if "preset" in file_values and file_values["preset"] != preset:
            # a file may name its own preset; it is applied first, then the file on top
            preset = file_values["preset"]
            if preset not in PRESETS:
                raise ConfigError(f"preset = {preset!r} is not one of {', '.join(PRESETS)}")
    # the task picks the preset's per-task values (the command line's task over the file's)
    task = (overrides or {}).get("task") or file_values.get("task") or "translation"
    check_choice("task", task, TASKS)
    merged: dict[str, Any] = {"preset": preset}
    _apply_preset(merged, preset, task)
    _deep_update(merged, file_values)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = merged
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"{dotted}: {part} is not a section")
        target[leaf] = value
    cfg = build_config(merged)
    if used_by is not None:
        check_sections_used(cfg, preset, task, used_by)
    return cfg


TASK_SECTIONS = {"image": "image-classification", "segmentation": "segmentation"}  # section -> the task that reads it


def check_sections_used(cfg: RunConfig, preset: str, task: str, used_by: Collection[str] = ()) -> None:
    """ConfigError when ``cfg`` sets a protocol's own section (``[trustformer]``) to other than the preset's values
    (the section's defaults: no preset sets one), and no strategy that runs reads it: neither ``cfg``'s strategy nor
    one of ``used_by``. A protocol's section is read by that protocol alone (``cfg.section(name)`` in its module, and
    by what describes its runs: the attestation, the reproduction's labels), never by a wrapper or another
    protocol, so it is silently ignored by every other strategy. Likewise a task's own section (``[image]``,
    ``[segmentation]``) on a run of another task."""
    strategies = sorted({cfg.federation.strategy, *used_by})
    baseline: dict[str, Any] = {}
    _apply_preset(baseline, preset, task)
    for name, its_task in TASK_SECTIONS.items():  # a task's own section, on a run of another task
        if task == its_task:
            continue
        section = getattr(cfg, name)
        preset_section = build(type(section), baseline.get(name, {}), prefix=f"{name}.")
        changed = [f.name for f in fields(section) if getattr(section, f.name) != getattr(preset_section, f.name)]
        if changed:
            raise ConfigError(
                f"{name}.{changed[0]} is set but --task {task} does not use the [{name}] section; drop it or use "
                f"--task {its_task}"
            )
    for name, section in cfg.sections:
        if name in strategies:
            continue
        preset_section = build(type(section), baseline.get(name, {}), prefix=f"{name}.")
        changed = [f.name for f in fields(section) if getattr(section, f.name) != getattr(preset_section, f.name)]
        if not changed:
            continue
        runs = (
            f"--strategy {strategies[0]} does not use"
            if not used_by
            else f"none of the strategies run ({', '.join(strategies)}) uses"
        )
        raise ConfigError(
            f"{name}.{changed[0]} is set but {runs} the [{name}] section; drop it or use --strategy {name}"
        )


def image_preset(name: str, **overrides: Any) -> ImageConfig:
    """The ``image`` section of a preset (``tiny``, ``small``, ``paper``) with overrides, validated."""
    return _task_section(ImageConfig, "image-classification", "image", name, overrides)


def seg_preset(name: str, **overrides: Any) -> SegmentationConfig:
    """The ``segmentation`` section of a preset (``tiny``, ``small``, ``paper``) with overrides, validated."""
    return _task_section(SegmentationConfig, "segmentation", "segmentation", name, overrides)


def _task_section(cls, task: str, section: str, name: str, overrides: Mapping[str, Any]):
    check_choice("preset", name, tuple(TASK_PRESETS[task]))
    values = {**TASK_PRESETS[task][name].get(section, {}), **overrides}
    config = build(cls, values, prefix=f"{section}.")
    config.validate()
    return config


def run_config_of(run_config: Mapping[str, Any]) -> RunConfig:
    """The run's configuration from a Flower context's ``run_config`` (parsed once per process and text)."""
    try:
        raw = run_config[CONFIG_KEY]
    except KeyError:
        raise ConfigError(f"run_config has no {CONFIG_KEY!r} entry (the resolved run configuration)") from None
    return parse_run_config(str(raw))


@lru_cache(maxsize=8)
def parse_run_config(text: str) -> RunConfig:
    """A run configuration from its JSON text, parsed and validated once per process and text."""
    return RunConfig.from_json(text)


def build_config(values: Mapping[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from plain (TOML/JSON) values; unknown keys are errors."""
    return build_run(values).validate()


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set key=value`` option; the value is read as TOML (numbers, booleans, lists), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. train.lr=3e-4")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def _deep_update(base: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
