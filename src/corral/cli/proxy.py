"""`corral proxy`: serve the deployments of the configured manager on one address.

`http://HOST:PORT/<deployment>/<path>` goes to `<path>` on a healthy replica of the deployment
(its name, or its id when several owners use the name); with `--domain D`, a request whose
`Host:` is `<deployment>.D` goes there whole. Runs with the configured client's token, which
must be an admin's (`corral up` writes one).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Annotated

import typer

from corral.cli._remote import connect
from corral.proxy.server import serve_proxy


def proxy_command(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any).")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    domain: Annotated[
        str | None,
        typer.Option(
            help="Also route by host name: `Host: <deployment>.DOMAIN` goes to the deployment, "
            "its whole path (e.g. `--domain localhost`: http://NAME.localhost:PORT/)."
        ),
    ] = None,
) -> None:
    """Forward `/<deployment>/...` (or `<deployment>.DOMAIN`) to the deployment's healthy
    replicas; a deployment whose access is by token asks for `Authorization: Bearer TOKEN`.
    `GET /metrics` is the proxy's own Prometheus metrics."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        typer.echo(f"corral: error: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    sock.listen(2048)
    bound = sock.getsockname()[1]

    def ready() -> None:
        typer.echo(f"proxy listening on http://{host}:{bound}", err=False)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_proxy(sock, connect, domain=domain, ready=ready))
    sock.close()
