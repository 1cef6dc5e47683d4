"""scripts/test.sh and .ci/run, run for real on a throw-away checkout: the environment's own commands
first on PATH, and CI failing on a skipped test whose reason is not on .ci/allowed-skips."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path):
    """scripts/test.sh and .ci/ copied into an empty folder whose .venv/bin holds this Python (a wrapper)
    and stand-in ``flwr``, ``ruff`` and ``mypy`` commands (the lint and type gate passes)."""
    for rel in ("scripts/test.sh", ".ci/run", ".ci/check_skips.py", ".ci/allowed-skips", "pyproject.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (
        ("python", f'exec "{sys.executable}" "$@"'),
        ("flwr", "exit 0"),
        ("ruff", "exit 0"),
        ("mypy", "exit 0"),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "tests").mkdir()
    return tmp_path


def run(checkout, *command):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TRUSTFORMER_SKIP_INSTALL"] = "1"
    return subprocess.run(
        ["bash", *command, "-p", "no:cacheprovider"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )


def test_test_script_puts_the_environments_commands_first_on_path(checkout):
    (checkout / "tests" / "test_path.py").write_text(
        "import os, shutil\n"
        "def test_flwr_is_the_environments():\n"
        "    assert shutil.which('flwr') == os.path.join(os.getcwd(), '.venv', 'bin', 'flwr')\n",
        encoding="utf-8",
    )
    done = run(checkout, "scripts/test.sh", "tests/test_path.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ci_fails_on_a_skip_that_is_not_allowed_and_prints_every_reason(checkout):
    test = checkout / "tests" / "test_some.py"
    test.write_text(
        "import pytest\ndef test_runs():\n    pass\ndef test_skipped():\n    pytest.skip('the network is down')\n",
        encoding="utf-8",
    )
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 1
    assert "SKIPPED, NOT ALLOWED" in done.stderr and "the network is down" in done.stderr

    test.write_text(test.read_text().replace("the network is down", "GPU-only: needs CUDA"), encoding="utf-8")
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped (allowed)" in done.stderr and "GPU-only: needs CUDA" in done.stderr


def test_ci_fails_when_a_test_fails_or_nothing_is_collected(checkout):
    (checkout / "tests" / "test_bad.py").write_text("def test_fails():\n    assert False\n", encoding="utf-8")
    assert run(checkout, ".ci/run", "tests").returncode == 1
    (checkout / "tests" / "test_bad.py").write_text("# no tests here\n", encoding="utf-8")
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 1 and "exit code 5" in done.stderr


def test_the_readme_command_leaves_the_slow_tier_to_ci_which_runs_both(checkout):
    (checkout / "tests" / "test_tiers.py").write_text(
        "import pytest\n"
        "def test_fast():\n    open('ran-fast', 'w').close()\n"
        "@pytest.mark.slow\n"
        "def test_slow():\n    open('ran-slow', 'w').close()\n",
        encoding="utf-8",
    )
    done = run(checkout, "scripts/test.sh", "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (checkout / "ran-fast").exists() and not (checkout / "ran-slow").exists()
    (checkout / "ran-fast").unlink()
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (checkout / "ran-fast").exists() and (checkout / "ran-slow").exists()
    (checkout / "tests" / "test_tiers.py").write_text(
        "import pytest\ndef test_fast():\n    pass\n@pytest.mark.slow\ndef test_slow():\n    assert False\n",
        encoding="utf-8",
    )
    assert run(checkout, ".ci/run", "tests").returncode == 1  # a failure in the slow tier fails CI


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_ci_fails_on_a_lint_or_type_finding_before_the_tests(checkout, tool):
    (checkout / "tests" / "test_ok.py").write_text("def test_runs():\n    open('ran', 'w').close()\n", encoding="utf-8")
    (checkout / ".venv" / "bin" / tool).write_text(f"#!/bin/sh\necho {tool}: 1 finding >&2\nexit 1\n", encoding="utf-8")
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 1 and f"{tool}: 1 finding" in done.stderr
    assert not (checkout / "ran").exists()  # the tests did not run


def test_ci_fails_on_unformatted_code_before_the_tests(checkout):
    (checkout / "tests" / "test_ok.py").write_text("def test_runs():\n    open('ran', 'w').close()\n", encoding="utf-8")
    (checkout / ".venv" / "bin" / "ruff").write_text(
        '#!/bin/sh\nif [ "$1" = format ]; then echo "would reformat: src/x.py" >&2; exit 1; fi\nexit 0\n',
        encoding="utf-8",
    )
    done = run(checkout, ".ci/run", "tests")
    assert done.returncode == 1 and "would reformat" in done.stderr
    assert not (checkout / "ran").exists()
