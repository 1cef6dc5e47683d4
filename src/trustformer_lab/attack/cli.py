"""``trustformer attack``: what an honest-but-curious server learns (the reconstruction and membership attacks,
``attack run``) and the empirical audit of a record-level DP run (``attack audit``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trustformer.cli_options import add_config_options, float_list, resolve_config, setup_logging, str_list
from trustformer.config import ConfigError, RunConfig, parse_override

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def add_attack_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attack",
        help="measure what an honest-but-curious server learns from a run",
        description="Attacks on a federation run in this process.",
    )
    what = p.add_subparsers(dest="attack", required=True)
    r = what.add_parser(
        "reconstruct",
        help="estimate every client's trained model from what the server holds; print the error table",
        description="Run a federation in this process (the options of `trustformer run`) and play the "
        "honest-but-curious server: from the payloads it receives (under secagg: only their sum), the run "
        "configuration and the public initial model it estimates each client's locally trained model, and "
        "reports the relative L2 error and the fraction of weights recovered within 1e-6 (mean over clients "
        "at the last exchange round). The sweep options run several configurations and print one table.",
    )
    m = what.add_parser(
        "membership",
        help="decide from what the server holds whether examples were in a client's training data",
        description="Run a federation in this process (the options of `trustformer run`) and attack the "
        "membership of every client's data from the server's estimate of its model (docs/privacy.md): AUC and "
        "TPR at 1% and 0.1% FPR per client and score, with the true local model and the client's final model as "
        "reference rows. Translation needs data.own_test_size > 0 (the non-members: pairs of the client's own "
        "domains that no client trained on). The sweep options run several configurations and print one table.",
    )
    m.add_argument("--candidates", type=int, default=300, help="members (and non-members) per client (default 300)")
    m.add_argument(
        "--reference-models",
        type=int,
        default=8,
        help="offline LiRA's reference models, trained by the server on halves of the public split "
        "(default 8; 0: no LiRA score)",
    )
    a = what.add_parser(
        "audit",
        help="audit a DP run in one training run: canaries through the real path, each step's release, ε_lb vs ε",
        description="Run a DP federation in this process with canaries and print the one-run lower bound ε_lb on ε at "
        "95% confidence beside the ε the run reports (Steinke, Nasr & Jagielski 2023; docs/privacy.md). Record level "
        "(the default): gradient canaries planted in client 0's DP-SGD (each included with probability ½), scored "
        "from each DP-SGD step's release (--view release, with the mechanism's conformance) or from the server's view "
        "of client 0's updates (--view server). Client level (--level client; dp-fedavg, dp-fedsam): canary "
        "clients sending random-direction updates of norm 10·C (Andrew et al. 2024), drawn, clipped and noised by "
        "the DP wrapper's own code, scored from the noisy aggregates the server releases. An audit run is not "
        "private for its canaries.",
    )
    add_config_options(a)
    a.add_argument(
        "--level",
        choices=("record", "client"),
        default="record",
        help="record: DP-SGD's per-record guarantee (privacy.unit = record) | client: the DP baselines' per-client "
        "guarantee (privacy.unit = client; strategy dp-fedavg unless given)",
    )
    a.add_argument(
        "--view",
        choices=("release", "server"),
        default="release",
        help="record level: release (the default, white-box): each DP-SGD step's noisy sum as the optimizer receives "
        "it, with the mechanism's conformance (noise, clipping, sampling, steps, accountant) | server: the server's "
        "view of client 0's updates after its optimizer (the threat model's view; looser)",
    )
    a.add_argument(
        "--canaries",
        type=int,
        help="canaries, spread over every parameter group (record level) or tensor (client level); default 10000 "
        "record, 2000 client",
    )
    a.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="honest-run benchmark: audit this many runs (seeds --seed, --seed + 1, ...) per epsilon and report how "
        "many fail (ε_lb > ε; at most 5%% may at 95%% confidence) and ε_lb/ε, beside the time of the same run without "
        "canaries (default 1: one audit)",
    )
    a.add_argument(
        "--epsilons",
        type=float_list,
        metavar="LIST",
        help="with --seeds: the reported epsilons to benchmark, e.g. 1,4,8 (default: privacy.epsilon)",
    )
    a.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    a.set_defaults(func=_cmd_audit)
    for q in (r, m):
        add_config_options(q)
        q.add_argument(
            "--strategies",
            type=str_list,
            metavar="LIST",
            help="comma-separated strategies to attack, one run each (default: --strategy)",
        )
        q.add_argument(
            "--betas",
            type=float_list,
            metavar="LIST",
            help="trustformer betas (and fedavg-topk's kept fraction), one run each, e.g. 0.1,0.5",
        )
        q.add_argument(
            "--memberships",
            type=str_list,
            metavar="LIST",
            help="trustformer membership modes, one run each, e.g. shared,local",
        )
        q.add_argument(
            "--secure-modes",
            type=str_list,
            metavar="LIST",
            help="secure exchange modes, one run each, e.g. none,secagg (combinations a mode does not "
            "support are skipped and listed)",
        )
        q.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
        q.add_argument("--quiet", action="store_true", help="only the table and warnings")
        q.set_defaults(func=_cmd_attack)


def _attack_setup(args: argparse.Namespace, default_out: str):
    import json

    from . import reconstruct as rec

    given = {item.partition("=")[0] for item in args.set}
    args.set = [f"{k}={json.dumps(v)}" for k, v in rec.FAST_EVAL.items() if k not in given] + list(args.set)
    if args.out is None:
        args.out = os.path.join("runs", default_out)
    setup_logging(quiet=True)
    cfg = resolve_config(args, strategies=args.strategies or ())
    runs, skipped = rec.plan(cfg, args.strategies, args.betas, args.memberships, args.secure_modes)
    for why in skipped:
        print(f"skipped {why}", file=sys.stderr)
    if not runs:
        raise ConfigError(
            "nothing to run: every combination of --strategies and --secure-modes was refused (see the lines above)"
        )
    if not args.quiet:
        print(
            f"attack {args.attack}: preset {cfg.preset} · {cfg.federation.clients} clients · "
            f"{cfg.federation.rounds} rounds · {len(runs)} run(s) · output {cfg.out}",
            file=sys.stderr,
            flush=True,
        )
    return cfg, runs


def _cmd_attack(args: argparse.Namespace) -> int:
    """``attack reconstruct`` / ``attack membership``: the sweep, its table, its note, the JSON."""
    import time

    from . import membership, reconstruct

    module = reconstruct if args.attack == "reconstruct" else membership
    cfg, runs = _attack_setup(args, f"attack-{args.attack}")
    started = time.perf_counter()
    options = (
        {"candidates": args.candidates, "reference_models": args.reference_models}
        if args.attack == "membership"
        else {}
    )
    results = module.sweep(cfg, runs, progress=not args.quiet, **options)
    print(module.format_table(results))
    print(f"{module.TABLE_NOTE} · total {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        module.write_json(args.json, cfg, results, "trustformer " + " ".join(sys.argv[1:]))
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    """``attack audit``: one run with canaries, ε_lb beside ε (record level: gradient canaries, :mod:`.dp_audit`;
    client level: canary clients, :mod:`.client_dp_audit`); with ``--seeds`` N > 1 or ``--epsilons``, the honest-run
    benchmark (:func:`dp_audit.honest_benchmark`)."""
    import functools
    import json

    from . import client_dp_audit, release_audit
    from .dp_audit import audit, format_benchmark, honest_benchmark

    client = args.level == "client"
    setup_logging(quiet=True)
    cfg, m = audit_config(args)
    run_audit: Callable[[RunConfig], dict[str, Any]]
    if client:
        run_audit = functools.partial(client_dp_audit.audit, canaries=m)
    elif args.view == "release":
        release_audit.supported(cfg)
        run_audit = release_audit.audit
    else:
        run_audit = audit
    warning = power_warning(m, cfg.privacy.delta)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.seeds < 1:
        raise ConfigError(f"--seeds = {args.seeds}: need at least 1")
    if args.seeds > 1 or args.epsilons:
        say = functools.partial(print, file=sys.stderr)
        bench = honest_benchmark(cfg, args.seeds, args.epsilons or (), progress=say, auditor=run_audit)
        print(format_benchmark(bench))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            bench["command"] = "trustformer " + " ".join(sys.argv[1:])
            Path(args.json).write_text(json.dumps(bench, indent=2) + "\n", encoding="utf-8")
        return 0 if all(row["failures"] <= _allowed_failures(row["seeds"]) for row in bench["rows"]) else 1
    result = run_audit(cfg)
    estimate = f" · ε̂ = {result['epsilon_estimate']:.3f} (Andrew et al. 2024, an estimate)" if client else ""
    broken = result["epsilon_lb"] > result["epsilon"] or result.get("verdict") == "fail"
    print(
        f"{result['strategy']} · secure {result['secure']} · {result['canaries']} canaries "
        f"({result['included']} included) · ε = {result['epsilon']:.3f} at δ = {result['delta']:g} · "
        f"ε_lb = {result['epsilon_lb']:.3f} (95%, one run; {result['correct']} of {result['guesses']} guesses right)"
        f"{estimate} · {'BROKEN: ' + ', '.join(result.get('failed_because') or ['ε_lb > ε']) if broken else 'KEPT'}"
    )
    if result.get("view") == "release":
        print(release_audit.format_result(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
    return 1 if broken else 0


def audit_config(args: argparse.Namespace) -> tuple[RunConfig, int]:
    """``attack audit``'s run configuration and its number of canaries m: the options under the audit's defaults
    (record level: privacy.unit = record and privacy.audit_canaries = m; client level: privacy.unit = client and
    dp-fedavg; no METEOR or BERTScore) and, where neither ``--set`` nor ``--config`` sets privacy.delta, δ =
    :func:`audit_delta` (m), at which the one-run bound has its power (the presets' δ = 1e-3 leaves it none)."""
    import json

    from trustformer.protocols.dp_fedavg import SPEC as DP_FEDAVG

    client = args.level == "client"
    m = args.canaries or (2000 if client else 10_000)
    given = {item.partition("=")[0].strip() for item in args.set}
    defaults: dict[str, object] = {"eval.meteor": False, "eval.bertscore": False}
    if client:
        defaults["privacy.unit"] = "client"
        if args.strategy is None:
            defaults["federation.strategy"] = DP_FEDAVG.name
    else:
        defaults.update({"privacy.unit": "record", "privacy.audit_canaries": m})
    if "privacy.delta" not in given and not _sets_delta(args.config):
        chosen = dict(parse_override(item) for item in args.set).get("privacy.audit_canaries")
        # --set privacy.audit_canaries over --canaries (a bad value is the loader's to report)
        canaries = chosen if not client and isinstance(chosen, int) and chosen > 0 else m
        defaults["privacy.delta"] = audit_delta(canaries)
    args.set = [f"{k}={json.dumps(v)}" for k, v in defaults.items() if k not in given] + list(args.set)
    if args.out is None:
        args.out = os.path.join("runs", "attack-audit")
    cfg = resolve_config(args)
    return cfg, (m if client else cfg.privacy.audit_canaries)


def audit_delta(canaries: int) -> float:
    """The audit's δ where the user sets none: 1e-5 (the README's), or the power of ten below it that keeps the
    one-run bound's δ term 2·m·δ at most 0.4 with m canaries (:func:`power_warning` warns from 0.5)."""
    return min(1e-5, 10.0 ** math.floor(math.log10(0.2 / canaries)))


def power_warning(canaries: int, delta: float) -> str | None:
    """Why an audit of m canaries at δ can show no ε_lb (2·m·δ ≥ 0.5), or None."""
    slack = 2 * canaries * delta
    if slack < 0.5:
        return None
    return (
        f"2·m·δ = {slack:.2g} (m = {canaries} canaries, δ = {delta:g}): the one-run bound's δ term leaves it almost "
        f"no power; lower privacy.delta (e.g. {audit_delta(canaries):g}, the audit's default) or --canaries"
    )


def _sets_delta(config: str | None) -> bool:
    """Whether the ``--config`` file sets privacy.delta (a file that cannot be read is reported by the loader)."""
    if not config:
        return False
    try:
        values = tomllib.loads(Path(config).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    privacy = values.get("privacy")
    return isinstance(privacy, dict) and "delta" in privacy


def _allowed_failures(seeds: int) -> int:
    """The most honest runs of ``seeds`` that may fail the audit before the benchmark itself fails: at a false-alarm
    rate of 5% (the bound's confidence), more failures than this happen with probability below 5%."""
    from scipy import stats

    return int(stats.binom.isf(0.05, seeds, 0.05))


__all__ = ["add_attack_parser"]
