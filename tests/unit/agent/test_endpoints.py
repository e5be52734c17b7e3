"""An agent's managers: `--manager` parsed, names with several addresses expanded."""

from __future__ import annotations

import pytest

from corral.agent import endpoints
from corral.agent.client import HttpManagerClient, ManagerUnavailableError
from corral.agent.endpoints import Endpoint, ManagerURLError, parse_manager_urls, resolve_endpoints
from corral.agent.protocol import RegisterRequest
from corral.domain.slots import ResourceSlots
from corral.testing.redis_server import free_port


def test_several_manager_urls_are_split_in_order_without_duplicates() -> None:
    """Comma-separated URLs keep their order; blanks, trailing slashes and repeats go."""
    value = "http://m1:8470/, http://m2:8470,,http://m1:8470"
    assert parse_manager_urls(value) == ["http://m1:8470", "http://m2:8470"]


@pytest.mark.parametrize("value", ["", " , ", "m1:8470", "ftp://m1", "http://"])
def test_a_bad_manager_value_is_refused_with_an_example(value: str) -> None:
    """Anything but http(s) URLs with a host is refused, saying what to write."""
    with pytest.raises(ManagerURLError, match="http"):
        parse_manager_urls(value)


def test_a_literal_address_is_one_endpoint() -> None:
    """An IP address is used as it is."""
    assert resolve_endpoints(["http://10.0.0.1:8470"]) == [Endpoint("http://10.0.0.1:8470")]


def test_a_name_with_several_addresses_is_one_endpoint_per_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each address of the name becomes an endpoint, in the resolver's order, keeping the
    name for the Host header; a name with one address stays as it is."""
    found = {"managers.internal": ["10.0.0.2", "10.0.0.1"], "one.internal": ["10.0.0.3"]}
    monkeypatch.setattr(endpoints, "_addresses", lambda host, _port: found.get(host, []))
    resolved = resolve_endpoints(["http://managers.internal:8470", "http://one.internal:8470"])
    assert resolved == [
        Endpoint("http://10.0.0.2:8470", host="managers.internal"),
        Endpoint("http://10.0.0.1:8470", host="managers.internal"),
        Endpoint("http://one.internal:8470"),
    ]


async def test_a_call_that_no_manager_answers_names_each_failure() -> None:
    """Every manager is tried once per call; the error says what each one did."""
    first, second = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    client = HttpManagerClient([first, second], timeout_s=2.0)
    request = RegisterRequest(
        agent_id="agent-1",
        address="127.0.0.1",
        slots=ResourceSlots({"cpu": 1}),
        runtime="simulated",
    )
    try:
        with pytest.raises(ManagerUnavailableError) as error:
            await client.register(request, "join-token")
    finally:
        await client.close()
    assert first in str(error.value) and second in str(error.value)
    assert client.current == 0
