"""Typed run configuration: presets, TOML files and command-line overrides, validated at load.

Precedence (lowest to highest): preset < ``--config FILE`` < command-line options. Every option lives in exactly
one place: the section dataclasses' field defaults are the ``small`` preset; the other presets list only what
they change.

- :mod:`.checks`: :class:`ConfigError` and the value checks the sections use
- :mod:`.faults`: the fault kinds and the parser of a ``federation.faults`` entry
- :mod:`.composition`: every check that depends on the strategy, read from the protocols' specs
- :mod:`.sections`, :mod:`.task_sections`: the sections and their own checks
- :mod:`.presets`: the presets
- :mod:`.coerce`: plain values to typed sections and back
- :mod:`.run`: :class:`RunConfig`, the whole configuration
- :mod:`.load`: presets, TOML files and overrides resolved into a :class:`RunConfig`
"""

from .checks import ConfigError
from .composition import STRATEGIES, UPDATE_RULES, check_composition
from .faults import (
    DATA_POISON_KINDS,
    FAULT_KINDS,
    FAULT_MESSAGES,
    MODEL_POISON_KINDS,
    PAYLOAD_FAULTS,
    POISON_DEFAULTS,
    POISON_KINDS,
    Fault,
)
from .load import (
    CONFIG_KEY,
    build_config,
    image_preset,
    load_config,
    parse_override,
    parse_run_config,
    run_config_of,
    seg_preset,
)
from .presets import PRESETS, TASK_PRESETS
from .privacy_section import PRIVACY_UNITS, PrivacyConfig
from .run import ADAPTERS_NOT_FOR_IMAGES, RunConfig
from .sections import (
    ADAPTERS,
    DEVICES,
    INITS,
    LORA_TARGETS,
    OPTIMIZERS,
    PARTITIONS,
    ROBUST_AGGREGATORS,
    SCHEDULES,
    SECURE_MODES,
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
from .task_sections import IMAGE_DATASETS, SEG_DATASETS, ImageConfig, SegmentationConfig

__all__ = [
    "ADAPTERS",
    "ADAPTERS_NOT_FOR_IMAGES",
    "CONFIG_KEY",
    "DATA_POISON_KINDS",
    "DEVICES",
    "FAULT_KINDS",
    "FAULT_MESSAGES",
    "IMAGE_DATASETS",
    "INITS",
    "LORA_TARGETS",
    "MODEL_POISON_KINDS",
    "OPTIMIZERS",
    "PARTITIONS",
    "PAYLOAD_FAULTS",
    "POISON_DEFAULTS",
    "POISON_KINDS",
    "PRESETS",
    "PRIVACY_UNITS",
    "ROBUST_AGGREGATORS",
    "SCHEDULES",
    "SECURE_MODES",
    "SEG_DATASETS",
    "STRATEGIES",
    "TASK_PARTITIONS",
    "TASK_PRESETS",
    "TASKS",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "Fault",
    "FederationConfig",
    "ImageConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RobustConfig",
    "RunConfig",
    "RuntimeConfig",
    "SecureConfig",
    "SegmentationConfig",
    "TrainConfig",
    "build_config",
    "UPDATE_RULES",
    "check_composition",
    "image_preset",
    "load_config",
    "parse_override",
    "parse_run_config",
    "run_config_of",
    "seg_preset",
]
