"""The proxy's pure parts: which deployment a `Host:` names, and a replica's answer head."""

from __future__ import annotations

import pytest

from corral.proxy.forward import ProxyApp
from corral.proxy.table import RouteTable
from corral.proxy.upstream import ReplicaFailedError, _parse_head


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (b"web.example.com", "web"),
        (b"web.example.com:8080", "web"),
        (b"WEB.Example.COM", "web"),
        (
            b"0b6c2a4e-1d1f-4c57-a4f2-0d6b1c3a9e11.example.com",
            "0b6c2a4e-1d1f-4c57-a4f2-0d6b1c3a9e11",
        ),
        (b"a.b.example.com", None),  # one label only
        (b"example.com", None),
        (b".example.com", None),
        (b"web.example.org", None),
        (b"[::1]:8080", None),
        (None, None),
    ],
)
def test_a_host_under_the_domain_names_a_deployment(
    host: bytes | None, expected: str | None
) -> None:
    """`<deployment>.<domain>` (any case, any port) names it; other hosts name none."""
    app = ProxyApp(RouteTable(), domain="Example.com.")
    assert app._host_deployment(host) == expected


def test_without_a_domain_no_host_names_a_deployment() -> None:
    """No `--domain`: routing is by path only."""
    assert ProxyApp(RouteTable())._host_deployment(b"web.example.com") is None


def test_an_answer_head_keeps_its_headers_and_frames_its_body() -> None:
    """Hop-by-hop headers go, content-length stays; chunked wins over a length; HTTP/1.0 and
    `Connection: close` end the connection after the answer."""
    sized = _parse_head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Model: m\r\nKeep-Alive: timeout=5\r\n\r\n"
    )
    assert (sized.status, sized._length, sized._chunked, sized._close) == (200, 2, False, False)
    assert sized.headers == [(b"content-length", b"2"), (b"x-model", b"m")]
    chunked = _parse_head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert (chunked._length, chunked._chunked, chunked._close) == (None, True, True)
    assert chunked.headers == []
    assert _parse_head(b"HTTP/1.0 204 No Content\r\n\r\n")._close
    with pytest.raises(ReplicaFailedError):
        _parse_head(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ReplicaFailedError):
        _parse_head(b"HTTP/1.1 abc\r\n\r\n")
