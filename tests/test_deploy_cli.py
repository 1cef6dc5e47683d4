"""Deployment errors a user can act on, checked before anything starts (no federation needed), and the
exit codes of `deploy client` (real flower-supernode processes against an address nobody serves)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from trustformer.cli import main

needs_flower = pytest.mark.skipif(
    not shutil.which("flower-supernode"), reason="Flower's deployment commands are not installed"
)


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("creds")
    assert main(["deploy", "certs", "--out", str(folder), "--clients", "1"]) == 0
    return folder


def test_a_busy_port_is_named_before_anything_starts(tmp_path, creds, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(
            [
                "deploy",
                "server",
                "--creds",
                str(creds),
                "--port",
                str(port),
                "--preset",
                "tiny",
                "--out",
                str(tmp_path / "run"),
                "--quiet",
            ]
        )
    assert code != 0
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err
    assert not (tmp_path / "run" / "superlink").exists()  # nothing was started


def test_tee_without_a_signing_key_is_refused_before_anything_starts(tmp_path, creds, capsys):
    code = main(
        [
            "deploy",
            "server",
            "--creds",
            str(creds),
            "--port",
            "0",
            "--preset",
            "tiny",
            "--secure",
            "tee",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ]
    )
    assert code != 0 and "secure.signing_key" in capsys.readouterr().err
    assert not (tmp_path / "run" / "superlink").exists()


def test_resume_refuses_a_preset_and_a_finished_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--preset",
                "tiny",
                "--rounds",
                "1",
                "--out",
                str(out),
                "--quiet",
                "--set",
                "runtime.store=disk",
                "--set",
                "eval.meteor=false",
                "--set",
                "eval.bertscore=false",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--preset", "tiny"]) == 2
    assert "drop --preset" in capsys.readouterr().err
    assert main(["run", "--resume", str(out)]) == 2
    assert "already finished" in capsys.readouterr().err


def _client(tmp_path, creds, *extra):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trustformer.cli",
            "deploy",
            "client",
            "--superlink",
            f"127.0.0.1:{port}",
            "--ca",
            str(creds / "ca.crt"),
            "--key",
            str(creds / "nodes" / "client-0.key"),
            "--partition",
            "0",
            "--dir",
            str(tmp_path / "client"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
@needs_flower
def test_a_client_at_a_wrong_address_gives_up_naming_the_options(tmp_path, creds):
    proc = _client(tmp_path, creds, "--give-up-after", "3")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "gave up" in out and "--superlink" in out and "--ca" in out


@needs_flower
def test_sigterm_to_a_client_is_a_requested_stop(tmp_path, creds):
    proc = _client(tmp_path, creds)
    try:
        deadline = time.monotonic() + 60
        log = tmp_path / "client" / "supernode.log"
        while not (log.exists() and log.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped (SIGTERM)" in out


@pytest.mark.parametrize("command", ["server", "local"])
def test_a_deployment_into_a_folder_that_holds_a_run_is_refused_before_anything_starts(
    tmp_path, creds, capsys, command
):
    out = tmp_path / "run"
    out.mkdir()
    extra = ["--creds", str(creds), "--port", "0"] if command == "server" else ["--clients", "1"]
    argv = ["deploy", command, *extra, "--preset", "tiny", "--out", str(out), "--quiet"]
    (out / "checkpoint.json").write_text("{}")
    assert main(argv) == 2
    assert f"trustformer deploy {command} --resume {out}" in capsys.readouterr().err
    (out / "summary.json").write_text("{}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds a finished run" in err and "--overwrite" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.json", "summary.json"]  # nothing was started
