"""corral's Python SDK: an async client of the REST API with typed results.

    async with Client.from_config() as corral:
        session = await corral.create_session(image="python", command=["python", "train.py"])
        async for chunk in corral.follow_logs(session.id):
            ...

Errors are `CorralError` subclasses carrying the API's problem details. There is one code path,
async; synchronous callers use `asyncio.run`.

Importing the package loads nothing yet: each name comes from its module on first use (PEP 562),
so a caller that needs only the configuration or the errors (`corral run --detach`) does not
build the models or the async client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.client._client import (
        DEFAULT_TIMEOUT_S,
        Client,
        LogStream,
        SessionRef,
        validate_spec,
        validated,
    )
    from corral.client.config import (
        ClientConfig,
        ClientConfigError,
        client_config_path,
        load_client_config,
        write_client_config,
    )
    from corral.client.errors import (
        AuthError,
        ConflictError,
        CorralError,
        FieldError,
        NotFoundError,
        ServerError,
        UnreachableError,
        ValidationError,
    )
    from corral.client.models import (
        TERMINAL_STATUSES,
        ActivateResult,
        Agent,
        ArrayElement,
        ArrayElementState,
        ArrayRemoveResult,
        ArrayTerminateResult,
        ArrayView,
        Attempt,
        Attempts,
        Deployment,
        Event,
        Explanation,
        HistoryEntry,
        IssuedToken,
        Kernel,
        OutputFile,
        Page,
        ResourceGroup,
        RetrySettings,
        Route,
        Session,
        SessionArray,
        TerminateResult,
        Token,
        Upload,
        User,
    )
    from corral.client.uploads import UploadError

# Each exported name → the module that defines it.
_HOMES = {
    "DEFAULT_TIMEOUT_S": "corral.client._client",
    "Client": "corral.client._client",
    "LogStream": "corral.client._client",
    "SessionRef": "corral.client._client",
    "validate_spec": "corral.client._client",
    "validated": "corral.client._client",
    "ClientConfig": "corral.client.config",
    "ClientConfigError": "corral.client.config",
    "client_config_path": "corral.client.config",
    "load_client_config": "corral.client.config",
    "write_client_config": "corral.client.config",
    "AuthError": "corral.client.errors",
    "ConflictError": "corral.client.errors",
    "CorralError": "corral.client.errors",
    "FieldError": "corral.client.errors",
    "NotFoundError": "corral.client.errors",
    "ServerError": "corral.client.errors",
    "UnreachableError": "corral.client.errors",
    "ValidationError": "corral.client.errors",
    "TERMINAL_STATUSES": "corral.client.models",
    "ActivateResult": "corral.client.models",
    "Agent": "corral.client.models",
    "ArrayElement": "corral.client.models",
    "ArrayElementState": "corral.client.models",
    "ArrayRemoveResult": "corral.client.models",
    "ArrayTerminateResult": "corral.client.models",
    "ArrayView": "corral.client.models",
    "Attempt": "corral.client.models",
    "Attempts": "corral.client.models",
    "Deployment": "corral.client.models",
    "Event": "corral.client.models",
    "Explanation": "corral.client.models",
    "HistoryEntry": "corral.client.models",
    "IssuedToken": "corral.client.models",
    "Kernel": "corral.client.models",
    "OutputFile": "corral.client.models",
    "Page": "corral.client.models",
    "ResourceGroup": "corral.client.models",
    "RetrySettings": "corral.client.models",
    "Route": "corral.client.models",
    "Session": "corral.client.models",
    "SessionArray": "corral.client.models",
    "TerminateResult": "corral.client.models",
    "Token": "corral.client.models",
    "Upload": "corral.client.models",
    "User": "corral.client.models",
    "UploadError": "corral.client.uploads",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found directly from now on
    return value


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TERMINAL_STATUSES",
    "ActivateResult",
    "Agent",
    "ArrayElement",
    "ArrayElementState",
    "ArrayRemoveResult",
    "ArrayTerminateResult",
    "ArrayView",
    "Attempt",
    "Attempts",
    "AuthError",
    "Client",
    "ClientConfig",
    "ClientConfigError",
    "ConflictError",
    "CorralError",
    "Deployment",
    "Event",
    "Explanation",
    "FieldError",
    "HistoryEntry",
    "IssuedToken",
    "Kernel",
    "LogStream",
    "NotFoundError",
    "OutputFile",
    "Page",
    "ResourceGroup",
    "RetrySettings",
    "Route",
    "ServerError",
    "Session",
    "SessionArray",
    "SessionRef",
    "TerminateResult",
    "Token",
    "UnreachableError",
    "Upload",
    "UploadError",
    "User",
    "ValidationError",
    "client_config_path",
    "load_client_config",
    "validate_spec",
    "validated",
    "write_client_config",
]
