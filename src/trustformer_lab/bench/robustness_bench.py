"""`trustformer bench robustness`: what malicious clients do to each protocol under each server defence.

Every combination of ``--settings`` × ``--strategies`` × ``--defences`` × (honest, and each of ``--faults``) runs
once (by default one setting, the ``bench federation`` non-IID setting on ``small``: 3 clients, one LibreOffice help
module each, 10 rounds; ``--settings 10x1,10x2,3x1`` runs 10 clients with 1 and with 2 malicious, and 3 with 1).
The malicious clients (spread evenly over the client ids, client 0 always honest) carry the fault in every round
(``round=*``); with more than one, the crafting kinds collude (``--collude``). Measured per row, over the honest
clients only:

- the final test loss on the shared test set, and its change from the honest run without a defence; the fault
  ``absent`` is the reference every defence aims at: the malicious clients simply drop out of every round
  (in process only), so the honest clients' data alone train the model;
- BLEU; the backdoor's success rate (triggered test sources translated to the attacker's sentence);
- its change from the same defence's ``absent`` run (what leaving the attackers out gives), where it ran;
- the events the defence raised (updates clipped, refused, left out, down-weighted), against the malicious clients
  and against honest ones;
- the server's time in the defence (``server_time_s.robust_s``: FLTrust's root training included) per round and as
  a share of the rounds' time; for the honest rows, its change of the honest test loss.

Faults: the ``federation.faults`` kinds (``scale``, ``sign_flip``, ``noise``, ``backdoor``, ``shuffled_targets``,
``alie``, ``min_max``, ``min_sum``), ``backdoor_scaled`` (a backdoor boosted n times, model replacement, and
norm-matched into the bound: ``kind=backdoor,factor=n``), ``backdoor_replace`` (the same boost sent as it is, plain
model replacement: ``kind=backdoor,factor=n,cap=no``) and ``absent``. ``--attack-rounds R`` makes the attackers leave
after round R (the backdoor's success is recorded every round: how long it lasts); ``--trigger`` and ``--target``
choose the backdoor.

Defences (``robust.*``, docs/robustness.md): ``none`` (no bound, plain mean), ``default`` (the configuration's
defaults), ``tight`` (the bound at 1.5× and refusal at 2× the round's median deviation), ``median``,
``trimmed_mean``, ``multikrum``, ``fltrust``, ``flame``, ``clip_noise`` (the rules with the default bound; a rule
the configuration refuses for this many clients, e.g. Krum with fewer than 2f + 3, is left out with its reason),
``root_finetune`` (one epoch of the server's clean fine-tuning on its root data after the mean, with the default
bound), ``flame+root_finetune``, ``rlr`` (the robust learning rate alone, no bound) and ``rlr+secagg`` (the same under
secure aggregation: the server sees only the sum of the updates and the sum of their signs), ``default+tee`` (the
default bound inside the attested aggregator of ``secure.mode = "tee"``, where the server itself sees no payload).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from trustformer.cli_options import add_config_options
from trustformer.config import ConfigError, RunConfig, build_config, load_config

from .federation_bench import base_config
from .robustness_figure import backdoor_figure

DEFENCES: dict[str, dict[str, Any]] = {
    "none": {"robust.bound": "none", "robust.aggregator": "mean"},
    "default": {},
    "tight": {"robust.bound_factor": 1.5, "robust.refuse_factor": 2.0},
    "median": {"robust.aggregator": "median"},
    "trimmed_mean": {"robust.aggregator": "trimmed_mean"},
    "multikrum": {"robust.aggregator": "multikrum"},
    "fltrust": {"robust.aggregator": "fltrust"},
    "flame": {"robust.aggregator": "flame"},
    "clip_noise": {"robust.aggregator": "clip_noise"},
    "rlr": {"robust.aggregator": "rlr", "robust.bound": "none"},  # the robust learning rate alone
    "rlr+secagg": {"robust.aggregator": "rlr", "robust.bound": "none", "secure.mode": "secagg"},
    "default+tee": {"secure.mode": "tee"},  # the default bound, inside the attested aggregator that opens each payload
    "rlr+bound": {"robust.aggregator": "rlr"},  # the robust learning rate after the default norm bound
    "root_finetune": {"robust.root_finetune": 1},
    "flame+root_finetune": {"robust.aggregator": "flame", "robust.root_finetune": 1},
}
CRAFTING = ("alie", "min_max", "min_sum", "backdoor_scaled")  # the faults that craft from what they see
FAULTS = ("scale", "sign_flip", "noise", "backdoor", "shuffled_targets", *CRAFTING, "backdoor_replace", "absent")
EVENTS = ("clipped", "refused", "excluded", "downweighted", "dropped")
BENCH_OPTIONS: dict[str, Any] = {"eval.meteor": False, "eval.bertscore": False, "runtime.threads": 1}


def malicious_clients(clients: int, count: int) -> list[int]:
    """``count`` client ids spread evenly over 1..clients-1 (client 0 stays honest, so its scores are an honest
    client's)."""
    if not 0 < count < clients:
        raise ConfigError(f"--malicious {count}: give between 1 and federation.clients - 1 = {clients - 1}")
    step = (clients - 1) / count
    return sorted({1 + int(i * step) for i in range(count)})


def fault_entries(
    fault: str,
    malicious: list[int],
    clients: int,
    collude: bool,
    backdoor_share: float = 0.0,
    backdoor: tuple[str, str] = ("", ""),
    mask: float = 0.0,
) -> list[str]:
    """The ``federation.faults`` entries of ``fault`` for the malicious clients, every round (``backdoor_share``:
    the share of a backdoor client's pairs poisoned, 0 = the fault's default; ``backdoor``: its trigger word and
    target sentence, "" = the fault's defaults; ``mask``: Neurotoxin's share of coordinates left alone, 0 = none)."""
    kind = "backdoor" if fault.startswith("backdoor") else fault
    extra = ""
    if fault in ("backdoor_scaled", "backdoor_replace"):
        extra = f",factor={clients}"  # model replacement: gamma = n / eta, eta = 1
    if fault == "backdoor_replace":
        extra += ",cap=no"
    if kind == "backdoor" and backdoor_share:
        extra += f",share={backdoor_share:g}"
    if kind == "backdoor":
        extra += "".join(f",{key}={value}" for key, value in zip(("trigger", "target"), backdoor, strict=True) if value)
        extra += f",mask={mask:g}" if mask else ""
    if fault in CRAFTING and collude:
        extra += ",collude=yes"
    return [f"client={c},round=*,kind={kind}{extra}" for c in malicious]


def leaving(malicious: list[int], after: int, rounds: int) -> list[str]:
    """``--attack-rounds``: the malicious clients gone (dropout) from round ``after`` + 1 on."""
    return (
        [f"client={c},round={r},kind=dropout" for c in malicious for r in range(after + 1, rounds + 1)] if after else []
    )


def plan(
    cfg: RunConfig,
    strategies: list[str],
    defences: list[str],
    faults: list[str],
    malicious: list[int],
    collude: bool = False,
    backdoor_share: float = 0.0,
    backdoor: tuple[str, str] = ("", ""),
    attack_rounds: int = 0,
    mask: float = 0.0,
) -> tuple[list[tuple[str, str, str, dict[str, Any]]], list[str]]:
    """(strategy, defence, fault, option values) of every run the configuration accepts, and why the others were
    left out (``attack_rounds``: the attackers leave after that round, 0 = they stay)."""
    n = cfg.federation.clients_per_round or cfg.federation.clients
    runs, skipped = [], []
    for strategy in strategies:
        for defence in defences:
            values = {"federation.strategy": strategy, **DEFENCES[defence]}
            if defence == "trimmed_mean":
                values["robust.trim_fraction"] = min(0.49, max(cfg.robust.trim_fraction, len(malicious) / n + 1e-9))
            if defence == "multikrum":
                values["robust.byzantine"] = len(malicious)
            for fault in ("honest", *faults):
                extra: dict[str, Any] = (
                    {}
                    if fault == "honest"
                    else {
                        "federation.faults": fault_entries(
                            fault, malicious, cfg.federation.clients, collude, backdoor_share, backdoor, mask
                        )
                        + leaving(malicious, attack_rounds, cfg.federation.rounds),
                        **({"federation.min_clients": n - len(malicious)} if attack_rounds else {}),
                    }
                )
                if fault == "absent":  # the reference: the malicious clients are simply not there
                    extra = {
                        "federation.faults": [
                            f"client={c},round={r},kind=dropout"
                            for c in malicious
                            for r in range(1, cfg.federation.rounds + 1)
                        ],
                        "federation.min_clients": n - len(malicious),
                    }
                try:
                    checked = load_config(cfg.preset, None, {**cfg.flat(), **values, **extra})
                    refused = update_rule_refusal(checked)
                    if refused:
                        raise ConfigError(refused)
                except ConfigError as exc:
                    skipped.append(f"{strategy} / {defence}{'' if fault == 'honest' else ' / ' + fault}: {exc}")
                    if fault == "honest":
                        break
                    continue
                runs.append((strategy, defence, fault, {**values, **extra}))
    return runs, skipped


def update_rule_refusal(cfg: RunConfig) -> str | None:
    """Why the protocol refuses a defence on whole-model updates (``make_protocol`` raises it at the run's start),
    or None."""
    from trustformer.protocols import make_protocol

    try:
        make_protocol(cfg)
    except ConfigError as exc:
        return str(exc)
    return None


def finished(cfg: RunConfig) -> dict[str, Any] | None:
    """The measurements an earlier invocation left for exactly this configuration (``--reuse``), or None."""
    done = Path(cfg.out) / "robustness.json"
    if not done.exists():
        return None
    previous = json.loads(done.read_text(encoding="utf-8"))
    try:  # options added since that run are read at their defaults, which is what it ran with
        same = build_config(previous.get("config") or {}).to_dict() == cfg.to_dict()
    except ConfigError:
        same = False
    return previous["result"] if same else None


def run_one(values: dict[str, Any], malicious: list[int], reuse: bool = False) -> dict[str, Any]:
    """One run (a worker's job): its summary over the honest clients, and the events of its defence (also written
    to ``<out>/robustness.json``)."""
    from trustformer.engine import run

    cfg = load_config(values["preset"], None, {k: v for k, v in values.items() if k != "preset"})
    if reuse and (previous := finished(cfg)) is not None:
        return previous
    started = time.perf_counter()
    summary = run(cfg)
    wall = time.perf_counter() - started
    honest = [i for i, c in enumerate(summary["client_ids"]) if c not in malicious]
    events = [
        json.loads(x)
        for x in (Path(cfg.out) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if '"event"' in x
    ]
    pick = lambda key: [summary[key][i] for i in honest] if key in summary else []  # noqa: E731
    records = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    per_round = [
        _mean(
            [r.get("backdoor_success") for r in records if r.get("round") == rnd and r.get("client") not in malicious]
        )
        for rnd in range(1, cfg.federation.rounds + 1)
    ]
    result = {
        "test_loss": _mean(pick("test_loss")),
        "bleu": _mean(pick("bleu")),
        "backdoor_success": _mean(pick("backdoor_success")),
        # the honest clients' mean every round, on the first 50 triggered test sources (the model they start the
        # round from)
        "backdoor_per_round": per_round if any(not math.isnan(v) for v in per_round) else [],
        # each honest owner's loss on its own held-out pairs (data.own_test_size > 0): what a rule that drops the odd
        # owner out costs that owner
        "own_loss_per_owner": pick("own_test_loss"),
        "secure": cfg.secure.mode,
        "wall_s": wall,
        "rounds": len(summary.get("round_time_s", [])),
        "round_s": sum(summary.get("round_time_s", [])),
        "defence_s": summary["server_time_s"].get("robust_s", 0.0),
        "events": {kind: sum(e["event"] == kind for e in events) for kind in EVENTS},
        "events_malicious": {
            kind: sum(e["event"] == kind and e.get("client") in malicious for e in events) for kind in EVENTS
        },
    }
    (Path(cfg.out) / "robustness.json").write_text(
        json.dumps({"config": cfg.to_dict(), "result": result}, indent=1, allow_nan=True) + "\n", encoding="utf-8"
    )
    return result


def _mean(values: list[Any]) -> float:
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return statistics.fmean(values) if values else math.nan


def table(
    runs: list[tuple[str, str, str, dict[str, Any]]],
    results: list[dict[str, Any]],
    setting: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """One row per run, with the change from the same protocol's honest run without a defence, from the same
    defence's ``absent`` run (else the undefended one's) and, for the honest rows, the defence's cost."""
    by = {(s, d, f): r for (s, d, f, _), r in zip(runs, results, strict=True)}
    rows = []
    for (strategy, defence, fault, values), result in zip(runs, results, strict=True):
        reference = by.get((strategy, "none", "honest"))
        own_honest = by.get((strategy, defence, "honest"))
        absent = by.get((strategy, defence, "absent")) or by.get((strategy, "none", "absent"))
        row = {
            **({"clients": setting[0], "malicious": setting[1]} if setting else {}),
            "strategy": strategy,
            "defence": defence,
            "fault": fault,
            "fault_entries": values.get("federation.faults", []),
            **result,
            "loss_change": result["test_loss"] - reference["test_loss"] if reference else math.nan,
            "vs_absent": result["test_loss"] - absent["test_loss"] if absent and fault != "honest" else math.nan,
            "defence_s_per_round": result["defence_s"] / result["rounds"] if result.get("rounds") else math.nan,
            "defence_share": result["defence_s"] / result["round_s"] if result["round_s"] else math.nan,
        }
        row["events_honest"] = {
            k: v - result.get("events_malicious", {}).get(k, 0) for k, v in result["events"].items()
        }
        if fault == "honest" and reference:
            row["cost_loss"] = result["test_loss"] - reference["test_loss"]
            row["cost_time"] = row["defence_share"]
        elif own_honest:
            row["vs_defended_honest"] = result["test_loss"] - own_honest["test_loss"]
        rows.append(row)
    return rows


def start_label(init: str, public_source: str) -> str:
    """A row's ``start``: ``scratch``, or ``public`` with the corpus its public model was also trained on."""
    return f"{init} (train.public_source = {public_source})" if init == "public" and public_source else init


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several ``--json`` files of one setting as one: every row (a later file's row replaces an earlier one of the
    same adapters, setting, protocol, defence, fault, attack rounds, trigger and mask), every command, and the changes
    from the honest runs taken again across all of them (a part without the undefended honest run has none of its
    own). Each row says which ``model.adapters`` its part trained (``adapters``)."""
    key = lambda r: (  # noqa: E731
        r["adapters"],
        r.get("clients"),
        r.get("malicious"),
        r["strategy"],
        r["defence"],
        r["fault"],
        r.get("attack_rounds", 0),
        r.get("trigger", ""),
        r.get("mask", 0.0),
    )
    rows: dict[Any, dict[str, Any]] = {}
    commands: list[str] = []
    for part in parts:
        for command in part.get("commands") or [part["command"]]:
            if command not in commands:
                commands.append(command)
        setting_of = part.get("setting", {})
        adapters = setting_of.get("model", {}).get("adapters", "none")
        train = setting_of.get("train", {})
        start = start_label(train.get("init", "scratch"), train.get("public_source", ""))
        for row in part["rows"]:
            row = {**row, "adapters": row.get("adapters", adapters), "start": row.get("start", start)}
            rows[key(row)] = row
    setting = lambda r: (r["adapters"], r.get("clients"), r.get("malicious"), r["strategy"])  # noqa: E731
    honest = {(*setting(r), r["defence"]): r for r in rows.values() if r["fault"] == "honest"}
    for r in rows.values():
        reference = honest.get((*setting(r), "none"))
        own = honest.get((*setting(r), r["defence"]))
        r["loss_change"] = r["test_loss"] - reference["test_loss"] if reference else math.nan
        if r["fault"] == "honest" and reference:
            r["cost_loss"] = r["loss_change"]
            r["cost_time"] = r["defence_share"]
        elif r["fault"] != "honest" and own:
            r["vs_defended_honest"] = r["test_loss"] - own["test_loss"]
    first = parts[0]
    return {
        "commands": commands,
        "settings": first["settings"],
        "setting": first["setting"],
        "rows": list(rows.values()),
        "left_out": sorted({x for part in parts for x in part.get("left_out", [])}),
    }


def _events_text(events: dict[str, int]) -> str:
    return " / ".join(str(events.get(k, 0)) for k in ("clipped", "refused", "excluded", "downweighted"))


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| clients | malicious | protocol | defence | fault | test loss | Δ vs honest, no defence | Δ vs absent | BLEU "
        "| backdoor success | events on attackers (clipped / refused / left out / down-weighted) | events on honest "
        "clients | defence s / round (share of the round) |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        backdoor = "" if math.isnan(r["backdoor_success"]) else f"{100 * r['backdoor_success']:.1f}%"
        absent = "" if math.isnan(r["vs_absent"]) else f"{r['vs_absent']:+.3f}"
        share = "" if math.isnan(r["defence_share"]) else f"{100 * r['defence_share']:.1f}%"
        per_round = "" if math.isnan(r["defence_s_per_round"]) else f"{r['defence_s_per_round']:.2f}"
        lines.append(
            f"| {r.get('clients', '')} | {r.get('malicious', '')} | {r['strategy']} | {r['defence']} | {r['fault']} | "
            f"{r['test_loss']:.3f} | {r['loss_change']:+.3f} | {absent} | {r['bleu']:.2f} | {backdoor} | "
            f"{_events_text(r.get('events_malicious', {}))} | {_events_text(r['events_honest'])} | "
            f"{per_round} ({share}) |"
        )
    return "\n".join(lines)


def settings_of(text: str) -> list[tuple[int, int]]:
    """``--settings``: ``CxM`` entries (C clients, M of them malicious), comma-separated."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        clients, sep, count = item.partition("x")
        if not sep or not clients.isdigit() or not count.isdigit():
            raise argparse.ArgumentTypeError(f"--settings {text!r}: give CxM entries (e.g. 10x1,10x2,3x1)")
        out.append((int(clients), int(count)))
    if not out:
        raise argparse.ArgumentTypeError("--settings: give at least one CxM entry")
    return out


def _names(text: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: give names from {', '.join(allowed)}, comma-separated")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench robustness",
        description="Malicious clients against each protocol and defence (module docstring "
        "of trustformer.bench.robustness_bench; docs/robustness.md).",
    )
    add_config_options(p)
    p.add_argument(
        "--strategies",
        default="fedavg,trustformer",
        type=lambda t: _names(t, ("fedavg", "trustformer", "fedavg-topk"), "--strategies"),
        help="protocols (default: fedavg,trustformer)",
    )
    p.add_argument(
        "--defences",
        default="none,default,median,trimmed_mean,multikrum",
        type=lambda t: _names(t, tuple(DEFENCES), "--defences"),
        help="defences (default: none,default,median,trimmed_mean,multikrum; also: tight)",
    )
    p.add_argument(
        "--faults",
        default="scale,sign_flip,noise,backdoor",
        type=lambda t: _names(t, FAULTS, "--faults"),
        help=f"poisoning faults (default: scale,sign_flip,noise,backdoor; all: {','.join(FAULTS)})",
    )
    p.add_argument("--malicious", type=int, default=1, help="malicious clients (default: 1)")
    p.add_argument(
        "--backdoor-share",
        type=float,
        default=0.0,
        help="the share of a backdoor client's pairs that carry the trigger, in (0, 1] (default: the fault's, 0.1)",
    )
    p.add_argument("--trigger", default="", help="the backdoor's trigger word (default: the fault's)")
    p.add_argument("--target", default="", help="the backdoor's target sentence, no commas (default: the fault's)")
    p.add_argument(
        "--mask",
        type=float,
        default=0.0,
        help="a backdoor trained outside the top share R of the coordinates the last global update moved "
        "(Neurotoxin; default 0: everywhere)",
    )
    p.add_argument(
        "--attack-rounds",
        type=int,
        default=0,
        help="the attackers leave after this round (0: they stay), to see how long a backdoor lasts",
    )
    p.add_argument(
        "--settings",
        type=settings_of,
        default=None,
        help="CxM entries: C clients of which M malicious, each a setting of its own "
        "(e.g. 10x1,10x2,3x1; default: --clients / the setting's clients and --malicious)",
    )
    p.add_argument(
        "--collude",
        choices=("auto", "yes", "no"),
        default="auto",
        help="whether the crafting faults (alie, min_max, min_sum, backdoor_scaled) share what they see; "
        "auto: when more than one is malicious",
    )
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each (default: 2)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument(
        "--figure", metavar="FILE.png", help="also draw each backdoor row's success round by round (when one has it)"
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a run whose folder holds the measurements of exactly "
        "the same configuration instead of running it again",
    )
    p.add_argument(
        "--no-default-setting",
        action="store_true",
        help="do not apply the benchmark's non-IID setting; run the preset/config as given",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 0.0 <= args.mask < 1.0:
        raise SystemExit(f"--mask {args.mask}: give a share in [0, 1)")
    if not 0.0 <= args.backdoor_share <= 1.0:
        raise SystemExit(f"--backdoor-share {args.backdoor_share}: give a share in (0, 1]")
    cfg = base_config(args, BENCH_OPTIONS, "runs/bench-robustness")
    settings = args.settings or [(cfg.federation.clients, args.malicious)]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    skipped_all: list[str] = []
    for clients, count in settings:
        setting_cfg = (
            cfg
            if clients == cfg.federation.clients
            else load_config(cfg.preset, None, {**cfg.flat(), "federation.clients": clients})
        )
        malicious = malicious_clients(clients, count)
        collude = args.collude == "yes" or (args.collude == "auto" and count > 1)
        runs, skipped = plan(
            setting_cfg,
            args.strategies,
            args.defences,
            args.faults,
            malicious,
            collude,
            args.backdoor_share,
            (args.trigger, args.target),
            args.attack_rounds,
            args.mask,
        )
        skipped_all += [f"{clients}x{count}: {reason}" for reason in skipped]
        for reason in skipped:
            print(f"left out: {reason}", file=sys.stderr)
        results = run_setting(setting_cfg, runs, malicious, args, f"{clients}x{count}" if args.settings else "")
        for row in table(runs, results, (clients, count)):
            start = start_label(setting_cfg.train.init, setting_cfg.train.public_source)
            row.update({"start": start, "adapters": setting_cfg.model.adapters})
            row.update({"attack_rounds": args.attack_rounds} if args.attack_rounds else {})
            row.update({"trigger": args.trigger} if args.trigger else {})
            row.update({"mask": args.mask} if args.mask else {})
            rows.append(row)
    print(format_table(rows))
    print(f"total {(time.perf_counter() - started) / 60:.1f} min")
    if args.figure and backdoor_figure(rows, args.figure) is None:
        print(f"--figure {args.figure}: no row has a per-round backdoor success; nothing drawn", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "trustformer bench robustness " + shlex.join(argv or []),
                    "settings": [{"clients": c, "malicious": malicious_clients(c, m)} for c, m in settings],
                    "setting": cfg.to_dict(),
                    "rows": rows,
                    "left_out": skipped_all,
                },
                indent=2,
                allow_nan=True,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


def run_setting(
    cfg: RunConfig,
    runs: list[tuple[str, str, str, dict[str, Any]]],
    malicious: list[int],
    args: argparse.Namespace,
    label: str,
) -> list[dict[str, Any]]:
    """Every run of one setting, ``--jobs`` at a time (one on the Simulation Engine), in run order."""
    out = Path(cfg.out)
    print(
        f"setting: preset {cfg.preset} · {cfg.federation.clients} clients ({len(malicious)} malicious: "
        f"{malicious}) · engine {cfg.runtime.engine} · {cfg.federation.rounds} rounds · {len(runs)} runs, "
        f"{args.jobs} at a time · output {out}",
        file=sys.stderr,
        flush=True,
    )
    prefix = f"{label}-" if label else ""
    jobs = [{**cfg.flat(), **values, "out": str(out / f"{prefix}{s}-{d}-{f}")} for s, d, f, values in runs]
    results: list[dict[str, Any]] = [{}] * len(runs)
    started = time.perf_counter()
    workers = 1 if cfg.runtime.engine == "simulation" else max(1, args.jobs)  # Ray takes the machine itself
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_one, job, malicious, args.reuse): i for i, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            results[i] = r = future.result()
            elapsed = time.perf_counter() - started
            print(
                f"[{done}/{len(runs)}] {label + ' / ' if label else ''}{' / '.join(runs[i][:3])}: test loss "
                f"{r['test_loss']:.3f} · BLEU {r['bleu']:.2f} · {r['wall_s']:.0f} s · elapsed {elapsed / 60:.1f} min "
                f"· ETA {elapsed / done * (len(runs) - done) / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    return results


__all__ = [
    "CRAFTING",
    "DEFENCES",
    "FAULTS",
    "fault_entries",
    "leaving",
    "merged",
    "format_table",
    "main",
    "malicious_clients",
    "plan",
    "run_one",
    "settings_of",
    "table",
]
