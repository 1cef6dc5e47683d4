"""Deployment pieces that need no running federation: credentials, the Flower App, node config, CLI errors."""

import stat

import pytest
import tomllib
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.config import validate_config
from helpers import jsonl

from trustformer.app import CONFIG_KEY
from trustformer.cli import main
from trustformer.config import RunConfig, load_config
from trustformer.deploy.certs import CredentialsError, check_public_key, write_credentials, write_node_key
from trustformer.deploy.fab import app_pyproject, write_app, write_run_config
from trustformer.deploy.launch import DeployError, deployment_config, free_port, node_config


def test_credentials_chain_and_key_formats(tmp_path):
    creds = write_credentials(tmp_path / "creds", clients=2, hosts=("127.0.0.1", "localhost", "fl.example.org"))
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises unless the CA signed it
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "fl.example.org"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for path in (creds.ca_key, creds.server_key, creds.node_key("client-0"), creds.node_key("client-1")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # what flower-supernode and `flwr supernode register` load: OpenSSH EC keys on a NIST curve
    private = serialization.load_ssh_private_key(creds.node_key("client-1").read_bytes(), None)
    public = serialization.load_ssh_public_key(creds.node_public_key("client-1").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert public.public_numbers() == private.public_key().public_numbers()
    assert [p.name for p in creds.public_keys()] == ["client-0.pub", "client-1.pub"]
    with pytest.raises(CredentialsError, match="already exists"):
        write_credentials(tmp_path / "creds")


def test_node_key_checks(tmp_path):
    _key, pub = write_node_key(tmp_path, "owner-7")
    assert check_public_key(pub) == pub
    (tmp_path / "bad.pub").write_text("ssh-rsa nonsense\n")
    with pytest.raises(CredentialsError, match="not an OpenSSH public key"):
        check_public_key(tmp_path / "bad.pub")
    with pytest.raises(CredentialsError, match="does not exist"):
        check_public_key(tmp_path / "missing.pub")
    with pytest.raises(CredentialsError, match="plain file name"):
        write_node_key(tmp_path, "../escape")


def test_flower_app_is_valid_and_carries_the_config(tmp_path):
    app = write_app(tmp_path / "app")
    config = tomllib.loads((app / "pyproject.toml").read_text())
    assert config == app_pyproject()
    valid, errors, _warnings = validate_config(config, check_module=True, project_dir=app)
    assert valid, errors
    cfg = load_config("tiny", None, {"out": str(tmp_path / "run")})
    run_config = tomllib.loads(write_run_config(tmp_path / "run.toml", cfg).read_text())
    assert RunConfig.from_json(run_config[CONFIG_KEY]) == cfg


def test_deployment_paths_are_absolute_and_node_config_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "pairs.tsv"
    data.write_text("привет\thello\n", encoding="utf-8")
    cfg = deployment_config(
        load_config("tiny", None, {"out": "runs/x", "data.source": "tsv", "data.path": "pairs.tsv"})
    )
    assert cfg.out == str(tmp_path / "runs" / "x") and cfg.data.path == str(data)
    node = node_config(2, "c2/state", "c2/out", data)
    assert node == {
        "partition-id": 2,
        "state-dir": str(tmp_path / "c2" / "state"),
        "diagnostics": False,
        "output-dir": str(tmp_path / "c2" / "out"),
        "train-file": str(data),
    }
    with pytest.raises(DeployError, match="no such file"):
        node_config(0, "s", train_file="missing.tsv")
    assert 0 < free_port() < 65536


def test_cli_certs_and_clear_errors(tmp_path, capsys):
    assert main(["deploy", "certs", "--out", str(tmp_path / "creds"), "--clients", "1"]) == 0
    assert "1 client key pair(s)" in capsys.readouterr().out
    assert (
        main(
            [
                "deploy",
                "server",
                "--creds",
                str(tmp_path / "nowhere"),
                "--preset",
                "tiny",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 1
    )
    assert "trustformer deploy certs" in capsys.readouterr().err
    assert (
        main(
            [
                "deploy",
                "client",
                "--superlink",
                "127.0.0.1:1",
                "--ca",
                str(tmp_path / "creds" / "ca.crt"),
                "--key",
                str(tmp_path / "creds" / "nodes" / "client-9.key"),
                "--partition",
                "0",
                "--dir",
                str(tmp_path / "c0"),
            ]
        )
        == 1
    )
    assert "client-9.key does not exist" in capsys.readouterr().err
    assert main(["deploy", "local", "--resume", str(tmp_path / "never-ran")]) == 1
    assert "never-ran does not exist" in capsys.readouterr().err


def test_client_trains_on_its_own_tsv_file(tmp_path):
    """node config ``train-file``: the client's own pairs replace its shard (tokenizer and test set
    still come from the run's configuration)."""
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from trustformer.app import client_app, server_app
    from trustformer.engine.inprocess import InProcessGrid, node_configs

    own = tmp_path / "own.tsv"
    own.write_text(
        "".join(f"это строка номер {i}\tthis is line number {i}\n" for i in range(25))
        + "слишком длинная строка " * 5
        + "\ttoo long\n",
        encoding="utf-8",
    )
    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path / "run"),
            "federation.rounds": 1,
            "runtime.progress": False,
            "eval.meteor": False,
            "eval.bertscore": False,
        },
    )
    nodes = node_configs(cfg)
    nodes[1]["train-file"] = str(own)
    grid = InProcessGrid(client_app, nodes, {CONFIG_KEY: cfg.to_json()})
    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        server_app(
            grid,
            Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={CONFIG_KEY: cfg.to_json()}),
        )
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous
    rows = jsonl(tmp_path / "run" / "metrics.jsonl")
    examples = {r["client"]: r["num_examples"] for r in rows}
    assert examples == {0: 60, 1: 25, 2: 60}  # the 15-word pair is over data.max_words = 12
