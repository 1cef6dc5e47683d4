"""The Flower ``ServerApp`` and ``ClientApp`` that run every protocol, in every runtime.

The in-process engine (``engine/inprocess.py``), Flower's Simulation Engine and a multi-process Flower
deployment (``deploy/``) run these very objects. The server's loop is ``runtime/server.py``; the client's
handlers are ``runtime/client.py``; the secure channel wraps the client's handlers as a Flower mod
(``secure/mod.py``) and the server's messages as a link (``secure/channel.py``).
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .config import CONFIG_KEY, run_config_of
from .runtime import client
from .runtime.node import process_setup
from .runtime.server import run_federation
from .secure.mod import make_secure_mod
from .wire import FederationError

server_app = ServerApp()
client_app = ClientApp(mods=[make_secure_mod(client.secure_view)])


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    cfg = run_config_of(context.run_config)
    process_setup(cfg, log_file=Path(cfg.out) / "server.log")
    run_federation(grid, cfg)


client_app.train()(client.train)
client_app.train("payload")(client.train_payload)
client_app.train("apply")(client.train_apply)
client_app.evaluate()(client.evaluate)
client_app.query()(client.query)
client_app.query("attest")(client.secure_channel_only)  # answered by the secure mod when secure.mode has it
client_app.query("secagg")(client.secure_channel_only)

__all__ = ["CONFIG_KEY", "FederationError", "client_app", "server_app"]
