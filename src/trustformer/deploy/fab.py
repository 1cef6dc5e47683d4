"""The Flower App that ``flwr run`` submits, and the run configuration it carries.

The app is a folder with one ``pyproject.toml`` naming the components ``trustformer.app:server_app``
and ``trustformer.app:client_app``; the ``trustformer`` package itself is installed on every
machine of the federation, so the Flower App Bundle (FAB) built from the folder holds no code and
the SuperLink runs with ``--disable-runtime-dependency-installation``. The run's resolved
configuration travels as JSON in the run config key ``trustformer-config`` (``config.CONFIG_KEY``),
passed to ``flwr run --run-config FILE.toml``.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

from .. import __version__
from ..config import CONFIG_KEY, RunConfig

APP_NAME = "trustformer-app"
PUBLISHER = "trustformer"


def app_pyproject() -> dict:
    """The ``pyproject.toml`` of the Flower App (components, and the one run config key)."""
    return {
        "project": {
            "name": APP_NAME,
            "version": __version__,
            "description": "Trustformer's ServerApp and ClientApp (the trustformer package is installed "
            "on every machine of the federation)",
            "license": "Apache-2.0",
            "dependencies": [],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": PUBLISHER,
                    "components": {
                        "serverapp": "trustformer.app:server_app",
                        "clientapp": "trustformer.app:client_app",
                    },
                    "config": {CONFIG_KEY: ""},
                }
            }
        },
    }


def write_app(directory: str | Path) -> Path:
    """Write the Flower App folder (its ``pyproject.toml``) and return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(tomli_w.dumps(app_pyproject()), encoding="utf-8")
    return directory


def write_run_config(path: str | Path, cfg: RunConfig) -> Path:
    """The ``--run-config`` file of ``flwr run``: the resolved configuration as JSON under ``CONFIG_KEY``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({CONFIG_KEY: cfg.to_json()}), encoding="utf-8")
    return path


__all__ = ["APP_NAME", "app_pyproject", "write_app", "write_run_config"]
