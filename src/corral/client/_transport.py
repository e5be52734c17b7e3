"""What the SDK's call mixins (`ClusterCalls`, `DeploymentCalls`) use of `Client`: its transport,
declared once for the type checker (`Client` defines both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class TransportCalls:
    """A base for calls mixed into `Client`: `_json` and `_send` are `Client`'s."""

    if TYPE_CHECKING:

        async def _json(
            self,
            method: str,
            path: str,
            *,
            params: Mapping[str, object] | None = None,
            json: object = None,
            content: bytes | None = None,
            headers: Mapping[str, str] | None = None,
        ) -> Any: ...

        async def _send(
            self,
            method: str,
            path: str,
            *,
            params: Mapping[str, object] | None = None,
            json: object = None,
            content: bytes | None = None,
            headers: Mapping[str, str] | None = None,
        ) -> httpx.Response: ...
