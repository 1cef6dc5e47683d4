"""The compositions the configuration accepts, generated from the protocol specs and the wrappers' options.

Every registered protocol (on a task its spec accepts) is combined with the options that wrap it or change its
server: payload coding at 2/4/8 bits, a server optimizer (Adam), client sampling, secure aggregation, a robust
rule, record-level DP, adaptive clipping, a public start with LoRA, and every membership mode where the protocol has
them. One option at a time
and every pair of options are tried; a combination the configuration refuses (``build_config``) is left out, so
the matrix follows the specs' ``refuses`` and the config's checks without a hand-kept list.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from trustformer.config import ConfigError, load_config
from trustformer.protocols import make_protocol
from trustformer.protocols.interface.state import fingerprint
from trustformer.registry import PROTOCOLS, protocol_spec

# Every run: tiny, 3 rounds, state on disk (so a resumed run finds its clients), seeded DP noise and sampling (so
# two runs can be compared at all), no slow scores.
BASE: dict[str, Any] = {
    "federation.rounds": 3,
    "runtime.store": "disk",
    "runtime.progress": False,
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
    "privacy.noise_source": "seeded-not-private",
    "privacy.on_exceed": "continue",
}

# option axis -> its settings beyond the default (the default of every axis is "off": no override). The axes in
# PROTOCOL_OPTIONS are read by the protocol object itself: they count only where they change it (memberships
# mean nothing to FedAvg); the others act in the runtime, and count wherever the configuration accepts them.
PROTOCOL_OPTIONS = ("clipping", "memberships")
AXES: dict[str, dict[str, dict[str, Any]]] = {
    "coding": {
        "8-bit": {"federation.payload_bits": 8},
        "4-bit": {"federation.payload_bits": 4},
        "2-bit": {"federation.payload_bits": 2},
        "2-bit nearest": {"federation.payload_bits": 2, "federation.payload_rounding": "nearest"},
    },
    "download": {"down 4-bit": {"federation.download_bits": 4}},
    "server-optimizer": {"adam": {"federation.server_optimizer": "adam"}},  # its moments and x_t: server state
    "sampling": {"2 of 3": {"federation.clients_per_round": 2}},
    "secure": {"secagg": {"secure.mode": "secagg"}},
    "robust": {
        "median": {"robust.aggregator": "median"},
        "flame": {"robust.aggregator": "flame"},  # its noise's seed counts the aggregations: server state
        "fltrust": {"robust.aggregator": "fltrust"},  # the root training's optimizer: server state
        # under secure aggregation each client keeps the model its next update's signs are measured from
        "rlr": {"robust.aggregator": "rlr"},
        # the fine-tuning pass's optimizer (its schedule's step count): server state
        "root finetune": {"robust.root_finetune": 1, "robust.root_size": 60},
    },
    "record-dp": {
        "record dp": {
            "privacy.unit": "record",
            "privacy.epsilon": 8.0,
            "privacy.delta": 1e-5,
            "privacy.batch_size": 16,
        },
        "distributed dp": {
            "privacy.unit": "record",
            "privacy.noise": "distributed",
            "secure.mode": "secagg",
            "privacy.epsilon": 8.0,
            "privacy.delta": 1e-5,
            "privacy.batch_size": 16,
        },
        # each owner's last noise share (its optimizer state) correlates the next round's: client state
        "banded dp": {
            "privacy.unit": "record",
            "privacy.noise": "distributed",
            "privacy.noise_bands": 2,
            "secure.mode": "secagg",
            "privacy.epsilon": 8.0,
            "privacy.delta": 1e-5,
            "privacy.batch_size": 16,
        },
    },
    "clipping": {
        "adaptive": {"privacy.clipping": "adaptive", "privacy.sampling_rate": 0.7, "privacy.clip_count_stddev": 4.0}
    },
    "start": {"public+lora": {"train.init": "public", "model.adapters": "lora", "train.public_epochs": 1}},
    "faults": {"sign-flip": {"federation.faults": ["client=1,round=*,kind=sign_flip"]}},
    "memberships": {m: {"trustformer.memberships": m} for m in ("shared", "tracked", "focused", "local")},
}


@dataclass(frozen=True)
class Composition:
    strategy: str
    options: tuple[str, ...]  # the option labels, one per axis used
    overrides: dict[str, Any] = field(hash=False, compare=False, default_factory=dict)

    @property
    def label(self) -> str:
        return " + ".join((self.strategy, *self.options))


def _task_overrides(strategy: str) -> dict[str, Any]:
    tasks = protocol_spec(strategy).tasks
    if tasks and "translation" not in tasks:
        return {"task": tasks[0], "image.dataset": "digits"}
    return {}


def _accepted(overrides: dict[str, Any]) -> bool:
    try:
        load_config("tiny", None, {**overrides, "out": ""})
    except ConfigError:
        return False
    return True


def _protocol_fingerprint(overrides: dict[str, Any]) -> list[dict[str, str]]:
    """What the protocol objects (every wrapper and the protocol inside) hold, apart from the configuration."""
    protocol = make_protocol(load_config("tiny", None, {**overrides, "out": ""}))
    chain = []
    while protocol is not None:
        chain.append({"type": type(protocol).__name__, **fingerprint(protocol)})
        protocol = getattr(protocol, "inner", None)
    return chain


def _changes_protocol(base: dict[str, Any], values: dict[str, Any]) -> bool:
    return _protocol_fingerprint(base) != _protocol_fingerprint({**base, **values})


@functools.cache
def compositions(max_options: int = 2) -> tuple[Composition, ...]:
    """Every protocol alone, with each option, and with every pair of options on different axes, where accepted
    (built once per process: the test modules share it)."""
    out: list[Composition] = []
    choices = [(axis, label, values) for axis, options in AXES.items() for label, values in options.items()]
    for strategy in PROTOCOLS:
        base = {**BASE, "federation.strategy": strategy, **_task_overrides(strategy)}
        applies = {
            (axis, label)
            for axis, label, values in choices
            if axis not in PROTOCOL_OPTIONS or (_accepted({**base, **values}) and _changes_protocol(base, values))
        }
        for count in range(max_options + 1):
            for combo in itertools.combinations(choices, count):
                if len({axis for axis, _label, _values in combo}) < count:
                    continue  # two options of one axis
                if any((axis, label) not in applies for axis, label, _values in combo):
                    continue  # an option this protocol does not read
                overrides = dict(base)
                for _axis, _label, values in combo:
                    overrides.update(values)
                if _accepted(overrides):
                    out.append(Composition(strategy, tuple(label for _a, label, _v in combo), overrides))
    return tuple(out)


def sample(matrix: list[Composition], count: int, seed: int, always: tuple[str, ...] = ()) -> list[Composition]:
    """``always`` (by label, where in the matrix) and ``count`` more drawn with ``seed``."""
    chosen = [c for c in matrix if c.label in always]
    rest = [c for c in matrix if c.label not in always]
    return chosen + random.Random(seed).sample(rest, min(count, len(rest)))
