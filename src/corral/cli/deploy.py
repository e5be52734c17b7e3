"""`corral deploy create | ls | info | scale | update | token | rm`: model-serving deployments.

A deployment runs N replicas of a server command, each an INFERENCE session; each replica
listens on the port the agent gives it in $CORRAL_PORT, and is probed over HTTP. The proxy
lets through requests carrying the deployment's token (`--access token`, the default) or
anyone's (`--access open`).
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
import typer

from corral.cli._common import env_flags, fail
from corral.cli._remote import JsonOption, call, local_time, print_json, print_table, text
from corral.client import Client, Deployment
from corral.client._deployments import validate_deployment
from corral.client.errors import ValidationError
from corral.domain.deployment import DEFAULT_ACCESS, Autoscaling, DeploymentAccess
from corral.domain.field_errors import describe, field_errors

app = typer.Typer(
    help="Model-serving deployments: create, list, show, scale, update, rotate the token, remove.",
    no_args_is_help=True,
)

DrainGraceOption = Annotated[
    float | None,
    typer.Option(
        help="Seconds a replica taken out may drain: no new requests, ended when its requests "
        "end or this much later (default 30)."
    ),
]
MinReplicasOption = Annotated[
    int | None, typer.Option(help="Autoscaling: the fewest replicas (default 1).")
]
MaxReplicasOption = Annotated[
    int | None,
    typer.Option(help="Autoscaling: the most replicas (setting it turns autoscaling on)."),
]
TargetInflightOption = Annotated[
    float | None,
    typer.Option(help="Autoscaling: requests in flight per replica to aim at (default 2)."),
]
UpscaleDelayOption = Annotated[
    float | None,
    typer.Option(help="Autoscaling: seconds more replicas must be wanted first (default 30)."),
]
DownscaleDelayOption = Annotated[
    float | None,
    typer.Option(help="Autoscaling: seconds fewer replicas must be wanted first (default 600)."),
]


def _autoscaling_flags(
    base: Autoscaling | None,
    min_replicas: int | None,
    max_replicas: int | None,
    target_inflight: float | None,
    upscale_delay: float | None,
    downscale_delay: float | None,
) -> dict[str, Any] | None:
    """The autoscaling policy the flags give over `base` (None: no flag given, none before)."""
    given = {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "target_inflight": target_inflight,
        "upscale_delay_s": upscale_delay,
        "downscale_delay_s": downscale_delay,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        return None
    merged = (base.model_dump() if base is not None else {}) | changes
    try:
        return Autoscaling.model_validate(merged).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        fail(describe(field_errors(exc, under=["autoscaling"])))


DeploymentArgument = Annotated[
    str, typer.Argument(metavar="DEPLOYMENT", help="The deployment's name or id.")
]


@app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The deployment's name.")],
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="CMD",
            help="The server and its arguments (after `--`); it listens on $CORRAL_PORT.",
            show_default=False,
        ),
    ],
    replicas: Annotated[int, typer.Option(min=0, help="How many replicas to run.")] = 1,
    image: Annotated[str, typer.Option(help="`python`, `shell`, or an image the agents know.")] = (
        "python"
    ),
    cpu: Annotated[str, typer.Option(help="CPU cores per replica: 2, 0.5 or 500m.")] = "1",
    mem: Annotated[str, typer.Option(help="Memory per replica: 4Gi, 4G, 4g.")] = "1g",
    gpus: Annotated[int, typer.Option(min=0, help="GPUs per replica.")] = 0,
    resource_group: Annotated[str, typer.Option(help="Where the replicas run.")] = "default",
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="KEY=VALUE in the replicas' environment (repeatable)."),
    ] = None,
    health_path: Annotated[str, typer.Option(help="The path probed with GET.")] = "/health",
    health_interval: Annotated[float, typer.Option(help="Seconds between probes.")] = 10.0,
    health_timeout: Annotated[float, typer.Option(help="A probe's time limit in seconds.")] = 1.0,
    health_initial_delay: Annotated[
        float, typer.Option(help="Seconds after a replica starts before it is probed.")
    ] = 0.0,
    failure_threshold: Annotated[
        int, typer.Option(help="Failed probes in a row that make a replica unhealthy.")
    ] = 3,
    success_threshold: Annotated[
        int, typer.Option(help="Passed probes in a row that make a replica healthy.")
    ] = 1,
    drain_grace: DrainGraceOption = None,
    min_replicas: MinReplicasOption = None,
    max_replicas: MaxReplicasOption = None,
    target_inflight: TargetInflightOption = None,
    upscale_delay: UpscaleDelayOption = None,
    downscale_delay: DownscaleDelayOption = None,
    access: Annotated[
        DeploymentAccess,
        typer.Option(
            help="token: the proxy asks for the deployment's token (printed once, now); "
            "open: anyone who reaches the proxy."
        ),
    ] = DEFAULT_ACCESS,
    as_json: JsonOption = False,
) -> None:
    """Create a deployment of CMD (after `--`), e.g.
    `corral deploy create llm --replicas 2 -- python server.py`."""
    fields: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": command,
        "env": env_flags(env or []),
        "resources": {"cpu": cpu, "mem": mem, **({"cuda.device": gpus} if gpus else {})},
        "resource_group": resource_group,
        "replicas": replicas,
        "health_check": {
            "path": health_path,
            "interval_s": health_interval,
            "timeout_s": health_timeout,
            "initial_delay_s": health_initial_delay,
            "failure_threshold": failure_threshold,
            "success_threshold": success_threshold,
        },
        "access": access.value,
    }
    if drain_grace is not None:
        fields["drain_grace_s"] = drain_grace
    autoscaling = _autoscaling_flags(
        None, min_replicas, max_replicas, target_inflight, upscale_delay, downscale_delay
    )
    if autoscaling is not None:
        fields["autoscaling"] = autoscaling
    try:
        spec = validate_deployment(fields)
    except ValidationError as exc:
        fail(str(exc))
    created = call(lambda client: client.create_deployment(spec))
    if as_json:
        print_json(created)
        return
    typer.echo(
        f"deployment {created.name} created ({created.replicas} replica(s)); "
        f"`corral deploy info {created.name}` shows its replicas"
    )
    if created.token is not None:
        typer.echo(
            f"token (shown this once; `corral deploy token {created.name}` makes a new one): "
            f"{created.token}\nsend it to the proxy as `Authorization: Bearer TOKEN`"
        )


@app.command("ls")
def ls_command(as_json: JsonOption = False) -> None:
    """List your deployments (admins: everyone's)."""

    async def fetch(client: Client) -> list[Deployment]:
        return await client.list_deployments()

    found = call(fetch)
    if as_json:
        print_json(found)
        return
    print_table(
        ["NAME", "OWNER", "LIFECYCLE", "REPLICAS", "LIVE", "HEALTHY", "IMAGE", "CREATED"],
        [
            [
                d.name,
                d.owner,
                d.lifecycle.value,
                str(d.replicas),
                str(d.live_replicas),
                str(d.healthy_replicas),
                d.image,
                local_time(d.created_at),
            ]
            for d in found
        ],
    )


@app.command("info")
def info_command(deployment: DeploymentArgument, as_json: JsonOption = False) -> None:
    """One deployment and each of its replicas: status, address, health, session."""
    found = call(lambda client: client.get_deployment(deployment))
    if as_json:
        print_json(found)
        return
    check = found.health_check
    print_table(
        None,
        [
            ["name", found.name],
            ["id", str(found.id)],
            ["owner", found.owner],
            ["lifecycle", found.lifecycle.value],
            [
                "replicas",
                f"{found.replicas} wanted, {found.live_replicas} live, "
                f"{found.healthy_replicas} healthy",
            ],
            ["command", " ".join(found.command)],
            ["image", found.image],
            ["resource group", found.resource_group],
            ["access", found.access.value],
            [
                "health check",
                f"GET {check.path} every {check.interval_s:g} s (timeout {check.timeout_s:g} s, "
                f"{check.failure_threshold} failures / {check.success_threshold} successes, "
                f"expects {check.expected_status})",
            ],
            ["draining", f"up to {found.drain_grace_s:g} s per replica taken out"],
            ["autoscaling", _autoscaling_said(found)],
            ["created", local_time(found.created_at)],
        ],
    )
    typer.echo("")
    print_table(
        ["ROUTE", "STATUS", "ADDRESS", "FAILURES", "HEALTH", "SESSION", "SINCE"],
        [
            [
                str(r.id)[:8],
                r.status.value,
                text(r.address),
                str(r.consecutive_failures),
                text(r.health_info)
                + (f" (draining until {local_time(r.drain_until)})" if r.drain_until else ""),
                f"{text(r.session_id and str(r.session_id)[:8])} {text(r.session_status)}",
                local_time(r.status_changed_at),
            ]
            for r in found.routes or ()
        ],
    )


def _autoscaling_said(found: Deployment) -> str:
    policy = found.autoscaling
    if policy is None:
        return "off"
    said = (
        f"{policy.min_replicas}..{policy.max_replicas} replicas, "
        f"{policy.target_inflight:g} requests in flight each "
        f"(delays: up {policy.upscale_delay_s:g} s, down {policy.downscale_delay_s:g} s)"
    )
    if found.autoscale_wanted is not None and found.autoscale_since is not None:
        said += f"; {found.autoscale_wanted} wanted since {local_time(found.autoscale_since)}"
    return said


@app.command("scale")
def scale_command(
    deployment: DeploymentArgument,
    replicas: Annotated[int, typer.Argument(metavar="REPLICAS", min=0, help="How many.")],
    as_json: JsonOption = False,
) -> None:
    """Change how many replicas a deployment runs."""
    found = call(lambda client: client.scale_deployment(deployment, replicas))
    if as_json:
        print_json(found)
        return
    typer.echo(f"deployment {found.name}: {found.replicas} replica(s) wanted")


@app.command("update")
def update_command(
    deployment: DeploymentArgument,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[CMD]", help="A new server command (after `--`).", show_default=False
        ),
    ] = None,
    image: Annotated[str | None, typer.Option(help="A new image.")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="The new environment, KEY=VALUE (repeatable)."),
    ] = None,
    max_unavailable: Annotated[
        int | None, typer.Option(min=0, help="How many fewer healthy replicas may serve meanwhile.")
    ] = None,
    drain_grace: DrainGraceOption = None,
    min_replicas: MinReplicasOption = None,
    max_replicas: MaxReplicasOption = None,
    target_inflight: TargetInflightOption = None,
    upscale_delay: UpscaleDelayOption = None,
    downscale_delay: DownscaleDelayOption = None,
    no_autoscaling: Annotated[
        bool, typer.Option("--no-autoscaling", help="Turn autoscaling off (the count stays).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Roll out a new command, image or environment, replica by replica (rolled back if the
    new version never becomes healthy). The drain grace and autoscaling flags alone change
    settings in place: no replica is replaced."""

    async def update(client: Client) -> Deployment:
        autoscaling = None
        if any(
            v is not None
            for v in (min_replicas, max_replicas, target_inflight, upscale_delay, downscale_delay)
        ):
            current = await client.get_deployment(deployment)
            autoscaling = _autoscaling_flags(
                current.autoscaling,
                min_replicas,
                max_replicas,
                target_inflight,
                upscale_delay,
                downscale_delay,
            )
        return await client.update_deployment(
            deployment,
            image=image,
            command=command or None,
            env=None if env is None else env_flags(env),
            max_unavailable=max_unavailable,
            drain_grace_s=drain_grace,
            autoscaling=autoscaling,
            stop_autoscaling=no_autoscaling,
        )

    found = call(update)
    if as_json:
        print_json(found)
        return
    if image is None and not command and env is None:
        typer.echo(f"deployment {found.name}: settings changed; its replicas keep running")
        return
    typer.echo(
        f"deployment {found.name}: rolling out revision {found.revision}; "
        f"`corral deploy info {found.name}` follows it"
    )


@app.command("token")
def token_command(deployment: DeploymentArgument, as_json: JsonOption = False) -> None:
    """Give a deployment (access by token) a new token and print it; the old one stops
    opening it within moments."""
    token = call(lambda client: client.rotate_deployment_token(deployment))
    if as_json:
        print_json({"token": token})
        return
    typer.echo(token)


@app.command("rm")
def rm_command(deployment: DeploymentArgument, as_json: JsonOption = False) -> None:
    """Destroy a deployment: its replicas end, then it is DESTROYED."""
    found = call(lambda client: client.destroy_deployment(deployment))
    if as_json:
        print_json(found)
        return
    typer.echo(f"deployment {found.name}: {found.lifecycle.value}")
