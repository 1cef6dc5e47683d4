"""The whole run configuration: its sections, the checks across them, and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from types import FrameType
from typing import Any

from ..registry import PROTOCOLS, protocol_spec, protocol_specs
from .checks import ConfigError, check_at_least, check_choice
from .coerce import build, did_you_mean, to_plain, unknown_key
from .composition import check_composition
from .faults import POISON_KINDS
from .presets import PRESETS
from .privacy_section import PrivacyConfig
from .sections import (
    TASK_PARTITIONS,
    TASKS,
    DataConfig,
    EvalConfig,
    FederationConfig,
    ModelConfig,
    RobustConfig,
    RuntimeConfig,
    SecureConfig,
    TrainConfig,
)
from .task_sections import ImageConfig, SegmentationConfig

ADAPTERS_NOT_FOR_IMAGES = (
    "the image tasks have no public split to pretrain a model on, and adapters on a frozen "
    "random network have nothing to adapt"
)


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # seed of every random choice (data split, initial model, batches, memberships, sampling)
    out: str = ""  # default: runs/<strategy>-<preset>-seed<seed>, then each setting that differs from the preset's
    # tiny (tests and smoke runs, seconds; too small to translate: its translations are blank or meaningless) |
    # small (the CPU demo, minutes) | paper (Table II, for a GPU)
    preset: str = "small"
    task: str = "translation"  # translation | image-classification | segmentation
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    secure: SecureConfig = field(default_factory=SecureConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    segmentation: SegmentationConfig = field(default_factory=SegmentationConfig)
    # the sections a protocol declares in its own module (its spec's ``section``: ``[fedprox]``), as (name, section)
    # pairs, each set in the configuration; read them with :meth:`section`
    sections: tuple[tuple[str, Any], ...] = ()

    def section(self, name: str) -> Any:
        """Protocol ``name``'s own section, ``[name]``: as configured, else its defaults."""
        for key, value in self.sections:
            if key == name:
                return value
        declared = protocol_spec(name).section
        if declared is None:
            raise ConfigError(f"federation.strategy {name!r} declares no configuration section")
        return declared()

    def validate(self) -> RunConfig:
        check_choice("preset", self.preset, tuple(PRESETS))
        check_choice("task", self.task, TASKS)
        check_at_least("seed", self.seed, 0)
        if self.data.partition not in TASK_PARTITIONS[self.task]:
            raise ConfigError(
                f"data.partition = {self.data.partition!r} does not apply to task = {self.task!r} "
                f"(one of: {', '.join(TASK_PARTITIONS[self.task])})"
            )
        if self.task == "image-classification":  # the selected task's section, through the task's own checks
            self.image.validate()
        elif self.task == "segmentation":
            self.segmentation.validate()
        for section in (
            self.data,
            self.model,
            self.train,
            self.federation,
            self.eval,
            self.runtime,
            self.privacy,
            *(value for _name, value in self.sections),
        ):
            section.validate()
        self._check_public_start()
        self._check_record_privacy()
        self.secure.validate()
        self.privacy.check_secure(self.secure.mode)
        self.robust.validate()
        if self.task != "translation" and any(f.kind == "backdoor" for f in self.federation.fault_plan()):
            raise ConfigError(
                f"federation.faults: kind backdoor needs task = 'translation' (a trigger word mapped to "
                f"a target sentence); task = {self.task!r} takes shuffled_targets"
            )
        if self.runtime.engine == "simulation":
            if protocol_spec(self.federation.strategy).pools_data:
                raise ConfigError(
                    f"federation.strategy = {self.federation.strategy!r} trains one client on every shard: run "
                    "it with runtime.engine = 'inprocess'"
                )
            if self.secure.mode in ("tee", "tee+secagg"):
                raise ConfigError(
                    f"secure.mode = {self.secure.mode!r} cannot run on runtime.engine = 'simulation': "
                    "Flower's Simulation Engine gives every virtual client the same node config, which "
                    "cannot carry each client's own trust anchors (the aggregator key and measurement "
                    "it pins); use runtime.engine = 'inprocess' or a deployment (trustformer deploy)"
                )
            boundary = [f.text for f in self.federation.fault_plan() if not f.poisons]
            if boundary:
                raise ConfigError(
                    f"federation.faults {boundary[0]!r}: faults of the reply itself are injected by "
                    "the in-process engine's grid: set runtime.engine = 'inprocess' to use them (the "
                    f"poisoning kinds, {', '.join(POISON_KINDS)}, run on every engine)"
                )
        check_composition(self)
        return self

    def _check_record_privacy(self) -> None:
        """Record-level DP-SGD: where it composes (docs/privacy.md "Record-level DP")."""
        if self.privacy.unit != "record":
            return
        if self.task != "translation":
            raise ConfigError(
                f"privacy.unit = 'record' applies to task = 'translation' (its per-pair losses); "
                f"task = {self.task!r} has no per-record DP-SGD yet: set privacy.unit = 'client'"
            )
        if self.model.adapters == "lora" and "embedding" in self.model.lora_targets:
            raise ConfigError(
                "privacy.unit = 'record' with model.lora_targets including 'embedding': the tied "
                "embedding's adapter also drives the output projection outside the adapter layer, "
                "where per-record gradients cannot see it; drop 'embedding' from model.lora_targets"
            )
        if self.privacy.audit_canaries and self.privacy.audit_canaries > 100_000:
            raise ConfigError(f"privacy.audit_canaries = {self.privacy.audit_canaries} is absurd (at most 100000)")

    def _check_public_start(self) -> None:
        """The public start and adapters: translation only; adapters need the public model under them."""
        if self.task != "translation" and self.train.init != "scratch":
            raise ConfigError(
                f"train.init = {self.train.init!r} applies to task = 'translation' only: the image "
                "tasks have no public split to pretrain on; set train.init = 'scratch'"
            )
        if self.model.adapters == "none":
            return
        if self.task != "translation":
            raise ConfigError(
                f"model.adapters = {self.model.adapters!r} applies to task = 'translation' only: "
                f"{ADAPTERS_NOT_FOR_IMAGES}; set model.adapters = 'none'"
            )
        if self.train.init != "public":
            raise ConfigError(
                f"model.adapters = {self.model.adapters!r} needs train.init = 'public': adapters "
                "adapt a frozen model, and a frozen random model holds nothing to adapt (only the "
                "rank-r updates would train); set train.init = 'public' (or model.adapters = 'none')"
            )

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sections"}
        values.update(dict(self.sections))
        return to_plain(
            {
                k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
                for k, v in values.items()
            }
        )

    def flat(self) -> dict[str, Any]:
        """Every option by its dotted key (``federation.rounds``), as ``load_config`` overrides take them."""
        values = self.to_dict()
        flat = {
            f"{section}.{key}": value
            for section, body in values.items()
            if isinstance(body, dict)
            for key, value in body.items()
        }
        flat.update({k: v for k, v in values.items() if not isinstance(v, dict)})
        return flat

    def to_json(self) -> str:
        return self.json

    @cached_property
    def json(self) -> str:
        """The configuration as canonical JSON (computed once: a frozen configuration never changes)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return build_run(json.loads(text)).validate()


class ConfigDeprecationWarning(FutureWarning):
    """A deprecated configuration key was read (it still works, for one release). A FutureWarning, so shown by
    default; issued at the first caller outside trustformer, and the command line prints only its message."""


def _caller_outside_package() -> int:
    """The ``stacklevel`` of ``warnings.warn``, called by this function's caller, that names the first frame
    outside the trustformer package: the user's call of :func:`load_config` (or the like), not a line of ours."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def deprecated_keys() -> dict[str, tuple[str, str]]:
    """Keys that moved to a protocol's own section (each spec's ``renamed``): old key -> (section, new key). They are
    still read for one release, with a message naming the new key."""
    return {old: (spec.name, new) for spec in protocol_specs() for old, new in spec.renamed.items()}


def _moved_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every deprecated key moved to its new place (FutureWarning naming it; ConfigError when the
    old and the new key are both set)."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in values.items()}
    for old, (section, key) in deprecated_keys().items():
        table, name = old.split(".")
        if not isinstance(out.get(table), dict) or name not in out[table]:
            continue
        value = out[table].pop(name)
        target = out.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{section} must be a table")
        if key in target:
            raise ConfigError(f"{old} and {section}.{key} are both set: keep {section}.{key} ({old} is deprecated)")
        warnings.warn(
            f"{old} is deprecated and will be removed in the next release: use {section}.{key}",
            ConfigDeprecationWarning,
            stacklevel=_caller_outside_package(),
        )
        target[key] = value
    return out


def build_run(values: Mapping[str, Any]) -> RunConfig:
    """A RunConfig from plain (TOML/JSON) values, unvalidated: the top-level tables named after a registered
    protocol are that protocol's own section (its spec's ``section``); every other key is a RunConfig field."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"config must be a table, got {values!r}")
    values = _moved_keys(values)
    if "sections" in values:
        raise ConfigError("unknown config key sections (a protocol's section is a table named after it: [fedprox])")
    own = set(values) & set(PROTOCOLS) - {f.name for f in dataclasses.fields(RunConfig)}
    plain = {k: v for k, v in values.items() if k not in own}
    _check_keys(plain)
    sections = []
    for name in sorted(own):
        declared = protocol_spec(name).section
        if declared is None:
            raise ConfigError(
                f"unknown config key {name} (federation.strategy {name!r} declares no section of its own)"
            )
        if isinstance(values[name], Mapping):
            _check_table_keys(name, values[name], frozenset(f.name for f in dataclasses.fields(declared)))
        sections.append((name, build(declared, values[name], prefix=f"{name}.")))
    return dataclasses.replace(build(RunConfig, plain, prefix=""), sections=tuple(sections))


@lru_cache(maxsize=1)
def _run_tables() -> dict[str, frozenset[str]]:
    """RunConfig's sections (``[train]``), each with its keys."""
    hints = typing.get_type_hints(RunConfig)
    return {
        f.name: frozenset(g.name for g in dataclasses.fields(hints[f.name]))
        for f in dataclasses.fields(RunConfig)
        if dataclasses.is_dataclass(hints[f.name])
    }


def _all_tables() -> dict[str, frozenset[str]]:
    """Every section with its keys: RunConfig's and the protocols' own (``[fedprox]``: imports every protocol, so
    called only to explain an error)."""
    tables = dict(_run_tables())
    for spec in protocol_specs():
        if spec.section is not None:
            tables[spec.name] = frozenset(f.name for f in dataclasses.fields(spec.section))
    return tables


def _check_keys(plain: Mapping[str, Any]) -> None:
    """The top-level keys of ``plain`` (less the protocols' sections) are RunConfig's, and each of its sections'
    keys are that section's: else ConfigError naming the closest valid ones (the protocols' sections among them;
    the internal ``sections`` field never)."""
    top = {f.name for f in dataclasses.fields(RunConfig)} - {"sections"}
    unknown = sorted(set(plain) - top)
    if unknown:
        name = str(unknown[0])
        tables = _all_tables()
        plain_keys = sorted(top - set(tables))
        hint = did_you_mean(name, [*tables, *plain_keys])
        listing = f"sections: {', '.join(sorted(tables))}; top-level keys: {', '.join(plain_keys)}"
        what = "section" if isinstance(plain[name], Mapping) else "key"
        raise ConfigError(f"unknown config {what} {name}{hint} ({listing})")
    for name, keys in _run_tables().items():
        if isinstance(plain.get(name), Mapping):
            _check_table_keys(name, plain[name], keys)


def _check_table_keys(name: str, table: Mapping[str, Any], keys: frozenset[str]) -> None:
    """Every key of section ``name`` is one of its ``keys``: else ConfigError naming the closest (or the same key in
    another section: ``federation.mu``, did you mean ``fedprox.mu``)."""
    unknown = sorted(set(table) - keys)
    if unknown:
        elsewhere = [f"{other}.{key}" for other, its in _all_tables().items() if other != name for key in its]
        raise unknown_key(f"{name}.", str(unknown[0]), keys, elsewhere)
