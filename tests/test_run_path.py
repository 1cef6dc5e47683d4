"""A run in one process (``trustformer run``) does not pass through ``trustformer.deploy``: its options resolve in
``cli_options`` and its parser leaves the deployment commands out. Checked in a fresh interpreter, on the
modules actually imported."""

import json
import subprocess
import sys
import textwrap

import pytest

from trustformer.cli import build_parser, command_of, main

PROBE = textwrap.dedent("""
    import json, sys
    import trustformer.engine as engine
    import trustformer.engine.inprocess  # the engine of a run in one process, imported as a run would
    runs = []
    engine.run = lambda cfg: runs.append(cfg) or {"test_loss": 1.0, "bleu": 2.0}  # no training: the path only
    from trustformer.cli import main
    code = main(sys.argv[1:])
    print(json.dumps({"code": code, "runs": len(runs),
                      "deploy": sorted(m for m in sys.modules if m.startswith("trustformer.deploy"))}))
""")


def _probe(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_trustformer_run_imports_nothing_of_deploy(tmp_path):
    result = _probe("run", "--preset", "tiny", "--quiet", "--out", str(tmp_path / "run"))
    assert (result["code"], result["runs"]) == (0, 1)
    assert result["deploy"] == [], f"`trustformer run` imported {result['deploy']}"


def test_trustformer_run_resume_imports_nothing_of_deploy(tmp_path):
    result = _probe("run", "--resume", str(tmp_path / "never-ran"))  # no checkpoint: refused, after the lookup
    assert result["code"] == 1 and result["runs"] == 0
    assert result["deploy"] == [], f"`trustformer run --resume` imported {result['deploy']}"


def test_the_probe_sees_an_import_of_deploy(tmp_path):
    """The check above would fail if the run path imported trustformer.deploy again."""
    result = _probe("attest", "--preset", "tiny")
    assert result["code"] == 0 and "trustformer.deploy.attest_cli" in result["deploy"]


def test_the_deployment_commands_are_still_there():
    assert command_of(["run", "--preset", "tiny"]) == "run"
    assert command_of(["--help"]) is None and command_of([]) is None
    full = build_parser()
    assert {"run", "deploy", "attest"} <= set(full._subparsers._group_actions[0].choices)
    assert full.parse_args(["deploy", "certs", "--out", "x"]).deploy_command == "certs"
    only_run = build_parser("run")
    assert "deploy" not in only_run._subparsers._group_actions[0].choices
    assert build_parser("deploy").parse_args(["deploy", "key", "--out", "x", "--name", "c"]).name == "c"
    assert "deploy" in build_parser("bogus")._subparsers._group_actions[0].choices  # its error lists every command


def test_main_parses_deploy_and_lists_it_in_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "deploy" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["deploy", "--help"])
    assert exit_.value.code == 0 and "certs" in capsys.readouterr().out
