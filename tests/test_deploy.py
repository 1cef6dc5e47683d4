"""A real Flower deployment on loopback: a SuperLink and SuperNodes as separate processes, with TLS
and SuperNode authentication. Every test has a hard time limit that kills the processes, and the
module's fixture stops them all in a ``finally``.

Each ClientApp message runs in a fresh process (about 3.5 s of CPU for imports), so a tiny round
costs about half a minute on two busy cores; the tests share one federation to start it only once.
"""

import json
import shutil
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import jsonl, tiny_config

from trustformer.deploy.launch import deployment_config, flwr_cli, submit_run, wait_for_run
from trustformer.deploy.local import LocalFederation
from trustformer.engine.inprocess import run_in_process
from trustformer.runtime.checkpoint import read_checkpoint, resume_config

pytestmark = pytest.mark.skipif(
    not all(shutil.which(c) for c in ("flower-superlink", "flower-supernode", "flwr")),
    reason="Flower's deployment commands are not installed",
)


@contextmanager
def hard_limit(fed: LocalFederation, seconds: float):
    """Kill every process of ``fed`` if the block is still running after ``seconds`` (then the waits
    inside fail at once instead of hanging)."""
    expired = threading.Event()

    def expire():
        expired.set()
        fed.kill()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if expired.is_set():
            pytest.fail(f"the deployment did not finish within its {seconds:.0f} s limit (processes killed)")


def wait_until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


def completed_round(out: Path) -> int:
    try:
        return read_checkpoint(out).round
    except Exception:  # not written yet, or being replaced
        return 0


DEPLOYED = {  # this module's tiny run (helpers.tiny_config), deployed
    "federation.strategy": "fedavg",
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.progress": True,
}


def deployed(out: Path, **overrides):
    """The tiny run of this module at ``out``, as the deployment runs it (its deployment config)."""
    return deployment_config(tiny_config(out, defaults=DEPLOYED, **overrides))


def run_and_wait(fed: LocalFederation, cfg, seconds: float) -> str:
    submitted = time.time() - 1.0
    run_id = submit_run(fed.server.home, cfg)
    return wait_for_run(
        fed.server.home,
        run_id,
        Path(cfg.out) / "summary.json",
        submitted_at=submitted,
        timeout_s=seconds,
        server=fed.server.superlink,
    )


def lines(cfg):
    return jsonl(Path(cfg.out) / "metrics.jsonl")


def results(line):
    """A metrics line less its timings, the simulation-only diagnostic and the upload bytes (which
    include that diagnostic's field in one process)."""
    return {k: v for k, v in line.items() if not k.endswith("_s") and k not in ("fedavg_distance", "bytes_up")}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = LocalFederation(tmp_path_factory.mktemp("deployment"), 3, extra_keys=("unregistered",))
    try:
        with hard_limit(fed, 120):
            fed.start_server()
            fed.start_clients()
            wait_until(
                lambda: (
                    [n["status"] for n in flwr_cli(fed.server.home, "supernode", "ls", "trustformer")["nodes"]]
                    == ["online"] * 3
                ),
                90,
                "the 3 SuperNodes to be online",
            )
        yield fed
    finally:
        fed.close()


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command): about 2 minutes of Flower's processes
def test_tls_authenticated_deployment_equals_the_in_process_run(federation, tmp_path):
    fed = federation
    host, port = "127.0.0.1", int(fed.server.superlink.info["port"])
    # TLS on the SuperLink's port: the federation's CA verifies it for 127.0.0.1, the system's does not
    context = ssl.create_default_context(cafile=str(fed.creds.ca_cert))
    with socket.create_connection((host, port)) as raw, context.wrap_socket(raw, server_hostname=host) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLCertVerificationError), socket.create_connection((host, port)) as raw:
        ssl.create_default_context().wrap_socket(raw, server_hostname=host)

    cfg = deployed(tmp_path / "deployed")
    with hard_limit(fed, 240):
        assert run_and_wait(fed, cfg, 230) == "finished:completed"
    reference = run_in_process(deployed(tmp_path / "in-process", **{"runtime.progress": False}))
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["client_ids"] == [0, 1, 2]
    assert summary["test_loss"] == reference["test_loss"]  # exactly: same seeds, same arithmetic
    assert [results(x) for x in lines(cfg)] == [results(x) for x in lines(deployed(tmp_path / "in-process"))]
    # the client that decoded the shared model wrote its translations on its own side, the others none
    scorers = set(summary["scored_by"].values())
    assert scorers == {0}
    for i in range(3):
        assert (fed.client_dir(i) / "output" / "translations.tsv").is_file() == (i in scorers)
        # its ClientApp processes reach the SuperNode over TLS on 127.0.0.1 as well
        assert "Uvicorn running on https://127.0.0.1:" in (fed.client_dir(i) / "supernode.log").read_text()


def test_unregistered_client_is_refused(federation):
    fed = federation
    with hard_limit(fed, 90):
        intruder = fed.start_client(0, key_name="unregistered")
        wait_until(lambda: not intruder.alive(), 80, "the unregistered SuperNode to be turned away")
    assert intruder.popen.returncode != 0
    assert "Failed to initialize the connection to the SuperLink" in intruder.log_path.read_text()
    nodes = flwr_cli(fed.server.home, "supernode", "ls", "trustformer")["nodes"]
    assert len(nodes) == 3  # only the registered keys


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_killed_client_is_dropped_and_rejoins(federation, tmp_path):
    fed = federation
    # each message starts a fresh ClientApp process: 20-45 s on 2 shared cores, so a 45 s wait dropped
    # healthy clients now and then
    cfg = deployed(
        tmp_path / "dropout",
        **{"federation.rounds": 4, "federation.min_clients": 2, "federation.round_timeout_s": 75.0},
    )
    with hard_limit(fed, 600):
        submitted = time.time() - 1.0
        run_id = submit_run(fed.server.home, cfg)
        wait_until(lambda: completed_round(Path(cfg.out)) >= 1, 150, "round 1")
        fed.nodes[1].kill()  # the whole SuperNode process tree, during round 2: a crash
        wait_until(lambda: any(x.get("event") == "dropped" for x in lines(cfg)), 150, "client 1 to be dropped")
        # it comes back with its state folder and key (same node id); the SuperLink accepts it once the
        # crashed instance has missed its heartbeats (at most a minute after the crash)
        fed.start_client(1, retry_refused_s=150)
        status = wait_for_run(
            fed.server.home,
            run_id,
            Path(cfg.out) / "summary.json",
            submitted_at=submitted,
            timeout_s=450,
            server=fed.server.superlink,
        )
    assert status == "finished:completed"
    rows = {(x["round"], x["client"]) for x in lines(cfg) if "event" not in x}
    dropped = [x for x in lines(cfg) if x.get("event") == "dropped"]
    absent = {(x["round"], x["client"]) for x in lines(cfg) if x.get("event") == "absent"}
    assert {(r, c) for r in (1, 2, 3, 4) for c in (0, 2)} <= rows  # the others never missed a round
    assert (1, 1) in rows and (2, 1) not in rows and (4, 1) in rows  # missed round 2, back by round 4
    assert (2, 1) in {(x["round"], x["client"]) for x in dropped}
    assert {x["client"] for x in dropped} == {1} and {x["round"] for x in dropped} <= {2, 3}
    # the round timeout, or the SuperLink's verdict once the crashed node missed its heartbeats
    reason = next(x for x in dropped if x["round"] == 2)["reason"]
    assert reason == "no reply to train" or reason.startswith("train failed: Error: Node Unavailable"), reason
    # round 3: it took part, or it was dropped again, or it was not connected at the round's start
    assert [(3, 1) in rows, any(x["round"] == 3 for x in dropped), (3, 1) in absent].count(True) == 1
    assert absent <= {(3, 1)}
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["client_ids"] == [0, 1, 2]


@pytest.mark.slow  # CI's slow tier (about 4 minutes: it waits on Flower's heartbeats)
def test_a_supernode_killed_and_restarted_mid_round_ends_as_the_uninterrupted_run(federation, tmp_path):
    """federation.restart_wait_s: client 1's SuperNode is killed during round 2 and started again (same key, same
    node id, same state folder). The message it held is sent again once it is back, and the run ends exactly as
    the uninterrupted in-process one: nobody is dropped, every loss is the same."""
    fed = federation
    settings = {"federation.restart_wait_s": 240.0, "federation.rounds": 3}
    cfg = deployed(tmp_path / "restarted", **settings)
    with hard_limit(fed, 600):
        submitted = time.time() - 1.0
        run_id = submit_run(fed.server.home, cfg)
        wait_until(lambda: completed_round(Path(cfg.out)) >= 1, 150, "round 1")
        fed.nodes[1].kill()  # the whole SuperNode process tree, while round 2 runs
        fed.start_client(1, retry_refused_s=150)
        status = wait_for_run(
            fed.server.home,
            run_id,
            Path(cfg.out) / "summary.json",
            submitted_at=submitted,
            timeout_s=450,
            server=fed.server.superlink,
        )
    log = Path(cfg.out) / "server.log"
    assert status == "finished:completed", log.read_text()[-4000:] if log.exists() else status
    reference = run_in_process(deployed(tmp_path / "uninterrupted", **settings, **{"runtime.progress": False}))
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert [x for x in lines(cfg) if "event" in x] == []  # nobody dropped
    assert summary["test_loss"] == reference["test_loss"]
    rows = {(x["round"], x["client"]): results(x) for x in lines(cfg)}
    expected = {(x["round"], x["client"]): results(x) for x in lines(deployed(tmp_path / "uninterrupted"))}
    drop_bytes = lambda row: {k: v for k, v in row.items() if k != "bytes_down"}  # noqa: E731 - resent: more down
    assert {k: drop_bytes(v) for k, v in rows.items()} == {k: drop_bytes(v) for k, v in expected.items()}


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_server_killed_after_round_1_resumes_to_the_same_result(federation, tmp_path):
    fed = federation
    cfg = deployed(tmp_path / "resumed", **{"federation.strategy": "trustformer"})
    with hard_limit(fed, 330):
        submit_run(fed.server.home, cfg)
        wait_until(lambda: completed_round(Path(cfg.out)) >= 1, 150, "round 1")
        fed.server.superlink.kill()  # SuperLink, its SuperExec and the ServerApp, mid-run
        fed.start_server()  # same port and database; the SuperNodes reconnect by themselves
        assert run_and_wait(fed, deployment_config(resume_config(cfg.out)), 200) == "finished:completed"
    reference = run_in_process(
        deployed(tmp_path / "uninterrupted", **{"federation.strategy": "trustformer", "runtime.progress": False})
    )
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["test_loss"] == reference["test_loss"]
    assert summary["resumed_after_rounds"] == [1]
    assert [x["event"] for x in lines(cfg) if "event" in x] == ["resumed"]
