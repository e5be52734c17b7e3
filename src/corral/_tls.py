"""TLS for whoever calls a manager (CLI, SDK, agents): which certificates they trust.

A client verifies the manager's certificate against the system's store, or against one CA file
(`--ca-file`, `CORRAL_CA_FILE`, `ca_file` in the client config) for a cluster with its own CA.
"""

from __future__ import annotations

import ssl
from pathlib import Path

CA_FILE_VARIABLE = "CORRAL_CA_FILE"


class TlsConfigError(Exception):
    """A CA file that cannot be used; the message names it and why."""


def verifying_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """A client context that verifies servers against `ca_file`, else the system's store."""
    try:
        return ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot use CA file {str(ca_file)!r}: {exc.strerror or exc}; give a PEM file of "
            "the CA that signed the manager's certificate"
        ) from exc


def untrusted_certificate(exc: BaseException) -> str | None:
    """Why the server's certificate was refused, when `exc` (or what it wraps) says so."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return (
                f"certificate verify failed: {seen.verify_message}"
                if seen.verify_message
                else str(seen)
            )
        text = str(seen)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return text
        seen = seen.__cause__ or seen.__context__
    return None


def untrusted_hint(url: str, reason: str) -> str:
    """What to tell a user whose client refused `url`'s certificate."""
    return (
        f"the TLS certificate of {url} is not trusted ({reason}); if the cluster has its own "
        f"CA, give its certificate with --ca-file or {CA_FILE_VARIABLE} (or `ca_file` in the "
        "client config)"
    )
