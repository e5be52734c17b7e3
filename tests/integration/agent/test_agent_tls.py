"""An agent's TLS to a real manager: the CA it is given, and the name it verifies.

The manager's certificate names only a host name; the agent reaches it by an address, as it does
for each address of a name with several (`agent.endpoints`), and must verify the name, not the
address."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from corral.agent.client import HttpManagerClient, ManagerUnavailableError
from corral.agent.endpoints import Endpoint
from corral.agent.protocol import RegisterRequest
from corral.domain.slots import ResourceSlots
from corral.manager.daemon import ManagerConfig, ManagerDaemon

NAME = "corral-manager.test"
JOIN = "tls-join"


async def test_an_agent_verifies_the_managers_name_against_its_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    issued = ca.issue_cert(NAME)
    ca_file, chain, key = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    ca.cert_pem.write_to_path(str(ca_file))
    issued.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    manager = ManagerDaemon(
        ManagerConfig(
            database_url=f"sqlite:///{tmp_path / 'corral.db'}",
            port=0,
            join_token=JOIN,
            tls_cert=chain,
            tls_key=key,
            grace_period_s=1,
        )
    )
    runner = await manager.start()
    address = manager.url
    assert address.startswith("https://127.0.0.1:")
    request = RegisterRequest(
        agent_id="tls-agent", address="127.0.0.1", slots=ResourceSlots.parse("cpu=1,mem=1g")
    )
    try:
        # By an address of the name: SNI and verification use the name.
        agent = HttpManagerClient([Endpoint(address, host=NAME)], ca_file=ca_file)
        try:
            registered = await agent.register(request, JOIN)
        finally:
            await agent.close()
        assert registered.token

        # Without the CA, or verifying the address the certificate does not name: refused, said.
        for refused, why in (
            (HttpManagerClient([Endpoint(address, host=NAME)]), "unable to get local issuer"),
            (HttpManagerClient(address, ca_file=ca_file), "IP address mismatch"),
        ):
            try:
                with pytest.raises(ManagerUnavailableError) as caught:
                    await refused.register(request, JOIN)
            finally:
                await refused.close()
            assert f"the TLS certificate of {address} is not trusted" in str(caught.value)
            assert why in str(caught.value)
            assert "--ca-file" in str(caught.value)
    finally:
        await manager.stop()
        await runner
