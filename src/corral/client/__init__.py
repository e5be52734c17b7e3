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

if TYPE_CHECKING:  # what each name is, for type checkers (`X as X`: exported)
    from corral.client._client import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
    from corral.client._client import Client as Client
    from corral.client._client import LogStream as LogStream
    from corral.client._client import SessionRef as SessionRef
    from corral.client._client import validate_spec as validate_spec
    from corral.client._client import validated as validated
    from corral.client.config import ClientConfig as ClientConfig
    from corral.client.config import ClientConfigError as ClientConfigError
    from corral.client.config import client_config_path as client_config_path
    from corral.client.config import load_client_config as load_client_config
    from corral.client.config import write_client_config as write_client_config
    from corral.client.errors import AuthError as AuthError
    from corral.client.errors import ConflictError as ConflictError
    from corral.client.errors import CorralError as CorralError
    from corral.client.errors import FieldError as FieldError
    from corral.client.errors import NotFoundError as NotFoundError
    from corral.client.errors import ServerError as ServerError
    from corral.client.errors import UnreachableError as UnreachableError
    from corral.client.errors import ValidationError as ValidationError
    from corral.client.models import TERMINAL_STATUSES as TERMINAL_STATUSES
    from corral.client.models import ActivateResult as ActivateResult
    from corral.client.models import Agent as Agent
    from corral.client.models import ArrayElement as ArrayElement
    from corral.client.models import ArrayElementState as ArrayElementState
    from corral.client.models import ArrayRemoveResult as ArrayRemoveResult
    from corral.client.models import ArrayTerminateResult as ArrayTerminateResult
    from corral.client.models import ArrayView as ArrayView
    from corral.client.models import Attempt as Attempt
    from corral.client.models import Attempts as Attempts
    from corral.client.models import Deployment as Deployment
    from corral.client.models import Event as Event
    from corral.client.models import Explanation as Explanation
    from corral.client.models import HistoryEntry as HistoryEntry
    from corral.client.models import IssuedToken as IssuedToken
    from corral.client.models import Kernel as Kernel
    from corral.client.models import OutputFile as OutputFile
    from corral.client.models import Page as Page
    from corral.client.models import ResourceGroup as ResourceGroup
    from corral.client.models import RetrySettings as RetrySettings
    from corral.client.models import Route as Route
    from corral.client.models import Session as Session
    from corral.client.models import SessionArray as SessionArray
    from corral.client.models import TerminateResult as TerminateResult
    from corral.client.models import Token as Token
    from corral.client.models import Upload as Upload
    from corral.client.models import User as User
    from corral.client.uploads import UploadError as UploadError

# Where each exported name is defined: imported from there on first use.
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


__all__ = sorted(_HOMES)
