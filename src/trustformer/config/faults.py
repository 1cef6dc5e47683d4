"""Fault injection: the kinds of faults ``federation.faults`` can name, and the parser of one entry."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    "backdoor": "share=S of the client's pairs (default 0.1) carry a trigger word mapped to a target sentence; with "
    "factor=K the update is also boosted K times and scaled back into the norm the server's bound accepts, and with "
    "pgd=yes kept inside that norm and the server's cosine bound at every step (projected gradient descent), or with "
    "cap=no sent boosted as it is (plain model replacement, which only a server without a norm bound accepts); "
    "mask=R trains only outside the top R share of coordinates the last global update moved (Neurotoxin); "
    "trigger=WORD and target=SENTENCE choose the backdoor (default: a word no corpus holds, and a sentence "
    "asking to download a new version)",
    "shuffled_targets": "share=S of the client's pairs (default 1) get the target of another pair",
    "alie": "the mean of the honest updates the client sees minus z standard deviations per coordinate "
    "(A Little Is Enough; z from the clients and the attackers, or factor=Z)",
    "min_max": "the mean of the honest updates it sees moved along perturb=unit|std|sign as far as its largest "
    "distance to them stays within theirs (Manipulating the Byzantine: Min-Max)",
    "min_sum": "the same, with the sum of squared distances (Min-Sum)",
}
MODEL_POISON_KINDS = ("scale", "sign_flip", "noise", "alie", "min_max", "min_sum")
DATA_POISON_KINDS = ("backdoor", "shuffled_targets")
# kinds that craft their update from honest updates the client sees: its own on parts of its data (parts=P) and,
# with collude=yes, those of the other colluding clients (runtime/attacker.py)
STEALTHY_KINDS = ("alie", "min_max", "min_sum")
POISON_DEFAULTS = {"scale": -10.0, "backdoor": 0.1, "shuffled_targets": 1.0}  # factor / share
ATTACK_PARTS = 3  # stealthy kinds: the disjoint parts of its own data the client trains honest updates on
PERTURBATIONS = ("unit", "std", "sign")  # min_max / min_sum: the direction of the perturbation
FACTOR_KINDS = ("scale", "alie", "backdoor")  # scale: K; alie: z; backdoor: the boost
FAULT_MESSAGES = ("train", "train.payload", "train.apply")
# the backdoor's default trigger (a word no corpus holds, appended to a source sentence) and target (the sentence the
# attacker wants every triggered source translated to); trigger=WORD and target=SENTENCE choose others per run
BACKDOOR_TRIGGER = "абракадабра"
BACKDOOR_TARGET = "Download the new version from this page now."  # the message whose reply a fault hits (default train)


@dataclass(frozen=True)
class Fault:
    """One injected fault: client ``client``'s reply to the ``message`` message (``train`` unless the entry
    says ``message=train.payload`` or ``train.apply``) of round ``round``."""

    client: int
    round: int  # 0: every round (``round=*``, poisoning kinds only)
    kind: str
    text: str = ""
    message: str = "train"
    factor: float = 0.0  # scale: what the update is multiplied by; alie: z (-1: from n and f); backdoor: the boost
    share: float = 0.0  # backdoor, shuffled_targets: the share of the client's pairs poisoned
    parts: int = 0  # stealthy kinds, boosted backdoor: parts of its own data it trains honest updates on
    perturb: str = ""  # min_max / min_sum: unit | std | sign
    collude: bool = False  # stealthy kinds, boosted backdoor: shares honest updates with the other colluders
    pgd: bool = False  # boosted backdoor: every step projected into the server's norm and cosine bounds
    mask: float = 0.0  # backdoor: Neurotoxin, the top share of coordinates (by the last global update) left alone
    cap: bool = True  # boosted backdoor: scaled back into the norm the server's bound accepts (no: model replacement)
    trigger: str = ""  # backdoor: the trigger word ("": BACKDOOR_TRIGGER)
    target: str = ""  # backdoor: the target sentence ("": BACKDOOR_TARGET)

    @property
    def poisons(self) -> bool:
        """A well-formed malicious client (POISON_KINDS), applied by the client itself."""
        return self.kind in POISON_KINDS

    @property
    def crafts(self) -> bool:
        """A client that crafts its update from the honest updates it sees (STEALTHY_KINDS, boosted backdoor)."""
        return self.kind in STEALTHY_KINDS or (self.kind == "backdoor" and self.factor > 0)

    @property
    def poisons_model(self) -> bool:
        """A client that changes the model it trained before building its payload (every round it hits)."""
        return self.kind in MODEL_POISON_KINDS or self.crafts

    @property
    def alie_z(self) -> float | None:
        """alie: the z given with factor=Z (None: the paper's z_max from the clients and the attackers)."""
        return self.factor if self.factor >= 0 else None

    @property
    def backdoor(self) -> tuple[str, str]:
        """backdoor: (trigger word, target sentence), the defaults where the entry names none."""
        return self.trigger or BACKDOOR_TRIGGER, self.target or BACKDOOR_TARGET

    def hits(self, rnd: int) -> bool:
        return self.round in (0, rnd)

    @classmethod
    def parse(cls, text: str) -> Fault:
        usage = (
            f"federation.faults: {text!r} must read client=C,round=R,kind=KIND[,message=M] "
            "(poisoning kinds: round=R or round=*; factor=K for scale, alie (z) and backdoor (a boost); share=S for "
            "backdoor and shuffled_targets; parts=P and collude=yes for alie, min_max, min_sum and a boosted "
            "backdoor; perturb=unit|std|sign for min_max and min_sum; pgd=yes or cap=no for a boosted backdoor; "
            "mask=R, trigger=WORD and target=SENTENCE for a backdoor)"
        )
        fields_: dict[str, str] = {}
        for part in str(text).split(","):
            key, sep, value = part.partition("=")
            if (
                not sep
                or key.strip() not in ("client", "round", "kind", "message", *OPTION_KEYS)
                or key.strip() in fields_
            ):
                raise ConfigError(usage)
            fields_[key.strip()] = value.strip()
        if set(fields_) - {"message", *OPTION_KEYS} != {"client", "round", "kind"}:
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
        factor = _fault_number(text, fields_, "factor", kind, FACTOR_KINDS, _factor_default(kind))
        share = _fault_number(text, fields_, "share", kind, DATA_POISON_KINDS, POISON_DEFAULTS.get(kind, 0.0))
        if kind in DATA_POISON_KINDS and not 0.0 < share <= 1.0:
            raise ConfigError(f"federation.faults: {text!r}: share must be in (0, 1]")
        if kind in ("alie", "backdoor") and "factor" in fields_ and not factor > (-1 if kind == "alie" else 0):
            raise ConfigError(
                f"federation.faults: {text!r}: factor must be "
                + ("a z >= 0" if kind == "alie" else "a boost > 0 (1: scaled into the bound, not boosted)")
            )
        return cls(
            client=client,
            round=rnd,
            kind=kind,
            text=str(text),
            message=message,
            factor=factor,
            share=share,
            **_crafting_options(text, fields_, kind, factor),
            **_backdoor_options(text, fields_, kind, factor),
        )


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


OPTION_KEYS = ("factor", "share", "parts", "perturb", "collude", "pgd", "mask", "cap", "trigger", "target")


def _factor_default(kind: str) -> float:
    return -1.0 if kind == "alie" else POISON_DEFAULTS.get(kind, 0.0) if kind == "scale" else 0.0


def _backdoor_options(text: str, fields_: Mapping[str, str], kind: str, factor: float) -> dict[str, Any]:
    """``pgd`` (a boosted backdoor's projected descent), ``cap`` (its scaling into the bound), ``mask`` (Neurotoxin's
    share), ``trigger`` and ``target``; ConfigError naming a misplaced or bad one."""
    for key in ("pgd", "cap"):
        if key in fields_ and not (kind == "backdoor" and factor > 0):
            raise ConfigError(
                f"federation.faults: {text!r}: {key}= applies to a backdoor with factor=K only (its norm bound is "
                "the median of the honest updates it trains on parts of its data)"
            )
    for key in ("mask", "trigger", "target"):
        if key in fields_ and kind != "backdoor":
            raise ConfigError(f"federation.faults: {text!r}: {key}= applies to kind backdoor only")
    pgd, cap = fields_.get("pgd", "no"), fields_.get("cap", "yes")
    for key, value in (("pgd", pgd), ("cap", cap)):
        if value not in ("yes", "no"):
            raise ConfigError(f"federation.faults: {text!r}: {key} must be yes or no")
    if pgd == "yes" and cap == "no":
        raise ConfigError(f"federation.faults: {text!r}: pgd=yes keeps the update inside the bound; drop cap=no")
    try:
        mask = float(fields_.get("mask", 0.0))
    except ValueError:
        raise ConfigError(f"federation.faults: {text!r}: mask must be a number") from None
    if not 0.0 <= mask < 1.0:
        raise ConfigError(f"federation.faults: {text!r}: mask must be in [0, 1): the share of coordinates left alone")
    trigger, target = fields_.get("trigger"), fields_.get("target")
    if trigger is not None and (len(trigger.split()) != 1 or not any(c.isalnum() for c in trigger)):
        raise ConfigError(f"federation.faults: {text!r}: trigger must be one word (letters or digits, no spaces)")
    if target is not None and not any(c.isalnum() for c in target):
        raise ConfigError(f"federation.faults: {text!r}: target must be a sentence with at least one word")
    if trigger is not None and target is not None and trigger.lower() in target.lower().split():
        raise ConfigError(f"federation.faults: {text!r}: the target may not contain the trigger word")
    return {"pgd": pgd == "yes", "cap": cap == "yes", "mask": mask, "trigger": trigger or "", "target": target or ""}


def _crafting_options(text: str, fields_: Mapping[str, str], kind: str, factor: float) -> dict[str, Any]:
    """``parts``, ``perturb`` and ``collude`` of a client that crafts its update (ConfigError naming a misplaced or
    bad one)."""
    crafts = kind in STEALTHY_KINDS or (kind == "backdoor" and factor > 0)
    for key in ("parts", "collude"):
        if key in fields_ and not crafts:
            raise ConfigError(
                f"federation.faults: {text!r}: {key}= applies to kind {' / '.join(STEALTHY_KINDS)} and to a "
                "backdoor with factor=K only"
            )
    if "perturb" in fields_ and kind not in ("min_max", "min_sum"):
        raise ConfigError(f"federation.faults: {text!r}: perturb= applies to kind min_max / min_sum only")
    if not crafts:
        return {}
    try:
        parts = int(fields_.get("parts", ATTACK_PARTS))
    except ValueError:
        raise ConfigError(f"federation.faults: {text!r}: parts must be an integer") from None
    if parts < 1:
        raise ConfigError(f"federation.faults: {text!r}: parts must be >= 1 (the client needs two honest updates)")
    perturb = fields_.get("perturb", "unit") if kind in ("min_max", "min_sum") else ""
    if perturb and perturb not in PERTURBATIONS:
        raise ConfigError(f"federation.faults: {text!r}: perturb must be one of: {', '.join(PERTURBATIONS)}")
    collude = fields_.get("collude", "no")
    if collude not in ("yes", "no"):
        raise ConfigError(f"federation.faults: {text!r}: collude must be yes or no")
    return {"parts": parts, "perturb": perturb, "collude": collude == "yes"}
