"""Fault injection: the kinds of faults ``federation.faults`` can name, and the parser of one entry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from .checks import ConfigError


FAULT_KINDS = {
    "nan": "the payload holds a NaN",
    "wrong_shape": "one payload array loses its last row",
    "empty_reply": "the reply has no content at all",
    "malformed_reply": "the metrics record is replaced by one of strings",
    "huge_num_examples": "the reply claims 10^15 training examples",
    "replay": "the client's reply to an earlier message is sent again instead",
    "dropout": "the client's node is gone: the SuperLink's 'Node Unavailable' error instead of a reply",
    "restart": "the client's node dies after handling the message, before its reply leaves, and comes back at once: "
    "'Node Unavailable', then the node is online again (federation.restart_wait_s sends the message again)",
    "stall": "the client answers only after the server stopped waiting (federation.round_timeout_s)",
}
PAYLOAD_FAULTS = ("nan", "wrong_shape")
# Well-formed malicious clients (docs/robustness.md): the client itself misbehaves, on any engine, so every
# check of shapes, counts and values passes. Model poisoning changes what it trained before it builds its
# payload; data poisoning changes its training pairs for the whole run.
POISON_KINDS = {
    "scale": "the client's update (trained minus starting model) times factor=K (default -10)",
    "sign_flip": "the client's update negated",
    "noise": "the client's update replaced by Gaussian noise of the same norm",
    "backdoor": "share=S of the client's pairs (default 0.1) carry a trigger word mapped to a target sentence",
    "shuffled_targets": "share=S of the client's pairs (default 1) get the target of another pair",
}
MODEL_POISON_KINDS = ("scale", "sign_flip", "noise")
DATA_POISON_KINDS = ("backdoor", "shuffled_targets")
POISON_DEFAULTS = {"scale": -10.0, "backdoor": 0.1, "shuffled_targets": 1.0}  # factor / share
FAULT_MESSAGES = ("train", "train.payload", "train.apply")  # the message whose reply a fault hits (default train)


@dataclass(frozen=True)
class Fault:
    """One injected fault: client ``client``'s reply to the ``message`` message (``train`` unless the entry
    says ``message=train.payload`` or ``train.apply``) of round ``round``."""

    client: int
    round: int  # 0: every round (``round=*``, poisoning kinds only)
    kind: str
    text: str = ""
    message: str = "train"
    factor: float = 0.0  # scale: what the update is multiplied by
    share: float = 0.0  # backdoor, shuffled_targets: the share of the client's pairs poisoned

    @property
    def poisons(self) -> bool:
        """A well-formed malicious client (POISON_KINDS), applied by the client itself."""
        return self.kind in POISON_KINDS

    def hits(self, rnd: int) -> bool:
        return self.round in (0, rnd)

    @classmethod
    def parse(cls, text: str) -> "Fault":
        usage = (
            f"federation.faults: {text!r} must read client=C,round=R,kind=KIND[,message=M] "
            "(poisoning kinds: round=R or round=*, and factor=K for scale, share=S for backdoor and "
            "shuffled_targets)"
        )
        fields_: dict[str, str] = {}
        for part in str(text).split(","):
            key, sep, value = part.partition("=")
            if (
                not sep
                or key.strip() not in ("client", "round", "kind", "message", "factor", "share")
                or key.strip() in fields_
            ):
                raise ConfigError(usage)
            fields_[key.strip()] = value.strip()
        if set(fields_) - {"message", "factor", "share"} != {"client", "round", "kind"}:
            raise ConfigError(usage)
        kind = fields_["kind"]
        if kind not in FAULT_KINDS and kind not in POISON_KINDS:
            raise ConfigError(
                f"federation.faults: {text!r}: kind {kind!r} is not one of: {', '.join([*FAULT_KINDS, *POISON_KINDS])}"
            )
        message = fields_.get("message", "train")
        if message not in FAULT_MESSAGES or (kind in POISON_KINDS and message != "train"):
            raise ConfigError(
                f"federation.faults: {text!r}: message {message!r} is not one of: "
                f"{', '.join(FAULT_MESSAGES if kind not in POISON_KINDS else ('train',))}"
            )
        every = fields_["round"] == "*"
        if every and kind not in POISON_KINDS:
            raise ConfigError(
                f"federation.faults: {text!r}: round=* (every round) applies to the poisoning kinds "
                f"only ({', '.join(POISON_KINDS)}); name one round"
            )
        if kind in DATA_POISON_KINDS and not every:
            raise ConfigError(
                f"federation.faults: {text!r}: kind {kind} poisons the client's data for the whole run: write round=*"
            )
        try:
            client, rnd = int(fields_["client"]), 0 if every else int(fields_["round"])
        except ValueError:
            raise ConfigError(f"federation.faults: {text!r}: client and round must be integers") from None
        if client < 0 or (rnd < 1 and not every):
            raise ConfigError(f"federation.faults: {text!r}: client must be >= 0 and round >= 1 (or *)")
        factor = _fault_number(text, fields_, "factor", kind, ("scale",), POISON_DEFAULTS.get(kind, 0.0))
        share = _fault_number(text, fields_, "share", kind, DATA_POISON_KINDS, POISON_DEFAULTS.get(kind, 0.0))
        if kind in DATA_POISON_KINDS and not 0.0 < share <= 1.0:
            raise ConfigError(f"federation.faults: {text!r}: share must be in (0, 1]")
        return cls(client=client, round=rnd, kind=kind, text=str(text), message=message, factor=factor, share=share)


def _fault_number(
    text: str, fields_: Mapping[str, str], key: str, kind: str, kinds: tuple[str, ...], default: float
) -> float:
    if key not in fields_:
        return default if kind in kinds else 0.0
    if kind not in kinds:
        raise ConfigError(f"federation.faults: {text!r}: {key}= applies to kind {' / '.join(kinds)} only")
    try:
        value = float(fields_[key])
    except ValueError:
        raise ConfigError(f"federation.faults: {text!r}: {key} must be a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"federation.faults: {text!r}: {key} must be finite")
    return value
