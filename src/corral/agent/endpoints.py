"""The managers an agent may talk to: several URLs, and every address of a name that has several.

`--manager http://m1:8470,http://m2:8470` names managers in order of preference; a name that
resolves to several addresses (`http://managers.internal:8470` with an A record per manager)
stands for each of them, in the resolver's order. The agent talks to the first that answers
and fails over to the next on a connection error or a 5xx (`agent.client`).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from corral.domain.record import record


class ManagerURLError(ValueError):
    """A --manager value corral cannot use."""


@record
class Endpoint:
    """One manager address: where to connect, and the host name it is known by."""

    url: str  # the base URL to connect to (an address replaces a name with several)
    host: str | None = None  # the original name, for the Host header and TLS (None: as url)

    def __str__(self) -> str:
        return self.url if self.host is None else f"{self.url} ({self.host})"


def parse_manager_urls(value: str) -> list[str]:
    """Split `--manager` on commas; each part must be an http(s) URL with a host."""
    urls = [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
    if not urls:
        raise ManagerURLError("no manager URL given; use e.g. http://10.0.0.1:8470")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ManagerURLError(
                f"{url!r} is not a manager URL; use http(s)://host:port, e.g. http://10.0.0.1:8470"
            )
    return list(dict.fromkeys(urls))


def resolve_endpoints(urls: list[str]) -> list[Endpoint]:
    """Each URL as an endpoint, or one per address when its host name has several (of the
    first address's family: a name with one IPv4 and one IPv6 address is one manager)."""
    endpoints: list[Endpoint] = []
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or ""
        addresses = _addresses(host, parts.port or (443 if parts.scheme == "https" else 80))
        if len(addresses) <= 1:
            endpoints.append(Endpoint(url))
            continue
        for address in addresses:
            shown = f"[{address}]" if ":" in address else address
            netloc = f"{shown}:{parts.port}" if parts.port else shown
            endpoints.append(Endpoint(parts._replace(netloc=netloc).geturl(), host=host))
    return list(dict.fromkeys(endpoints))


def _addresses(host: str, port: int) -> list[str]:
    """The addresses of `host` in the resolver's order ([] for a literal or a failed lookup:
    the name is then tried as it is, and its failure reported by the first request)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    if not found:
        return []
    family = found[0][0]
    return list(dict.fromkeys(str(info[4][0]) for info in found if info[0] == family))
