"""`corral agent ls | drain | undrain | rm`: the cluster's agents, their state, capacity and
load; admins drain them and remove those that left."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli._remote import JsonOption, age, call, print_json, print_table, text
from corral.client import Agent, Client


def agent_ls_command(
    status: Annotated[
        str | None, typer.Option(help="Only agents in this status: ALIVE, LOST or TERMINATED.")
    ] = None,
    resource_group: Annotated[str | None, typer.Option(help="Only this resource group.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List the agents: status, whether they take work, slots offered and held."""

    async def fetch(client: Client) -> list[Agent]:
        agents = client.iter_agents(
            status=status.upper() if status else None,
            resource_group=resource_group,
            page_size=1000,
        )
        return [agent async for agent in agents]

    agents = call(fetch)
    if as_json:
        print_json(agents)
        return
    if not agents:
        typer.echo("no agents", err=True)
        return
    print_table(
        [
            "ID",
            "STATUS",
            "SCHEDULABLE",
            "GROUP",
            "RUNTIME",
            "KERNELS",
            "CAPACITY",
            "OCCUPIED",
            "HEARTBEAT",
            "ADDRESS",
        ],
        [
            [
                a.id,
                a.status,
                "yes" if a.schedulable else "no (drained)",
                a.resource_group,
                a.runtime,
                str(a.kernels),
                text(a.capacity.format_brief()),
                text(a.occupied.format_brief()),
                age(a.last_heartbeat_at) + ("" if a.last_heartbeat_at is None else " ago"),
                a.address,
            ]
            for a in agents
        ],
    )


AgentArgument = Annotated[str, typer.Argument(metavar="AGENT", help="The agent's id.")]


def agent_drain_command(agent_id: AgentArgument, as_json: JsonOption = False) -> None:
    """Place no new kernels on the agent (admins); its kernels keep running."""
    agent = call(lambda client: client.drain_agent(agent_id))
    if as_json:
        print_json(agent)
        return
    typer.echo(
        f"agent {agent.id} drained: nothing new is placed on it; "
        f"its {agent.kernels} kernel(s) keep running"
    )


def agent_undrain_command(agent_id: AgentArgument, as_json: JsonOption = False) -> None:
    """Let the scheduler place kernels on the agent again (admins)."""
    agent = call(lambda client: client.undrain_agent(agent_id))
    if as_json:
        print_json(agent)
        return
    typer.echo(f"agent {agent.id} takes work again")


def agent_rm_command(agent_id: AgentArgument) -> None:
    """Remove an agent that left, LOST or TERMINATED, and runs nothing (admins)."""
    call(lambda client: client.remove_agent(agent_id))
    typer.echo(f"agent {agent_id} removed")
