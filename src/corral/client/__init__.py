"""corral's Python SDK: an async client of the REST API with typed results.

    async with Client.from_config() as corral:
        session = await corral.create_session(image="python", command=["python", "train.py"])
        async for chunk in corral.follow_logs(session.id):
            ...

Errors are `CorralError` subclasses carrying the API's problem details. There is one code path,
async; synchronous callers use `asyncio.run`.
"""

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
    Agent,
    ArrayElement,
    ArrayElementState,
    ArrayRemoveResult,
    ArrayTerminateResult,
    ArrayView,
    Attempt,
    Attempts,
    Event,
    Explanation,
    HistoryEntry,
    IssuedToken,
    Kernel,
    OutputFile,
    Page,
    ResourceGroup,
    RetrySettings,
    Session,
    SessionArray,
    TerminateResult,
    Token,
    Upload,
    User,
)
from corral.client.uploads import UploadError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TERMINAL_STATUSES",
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
