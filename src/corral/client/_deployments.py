"""The SDK's calls for model-serving deployments: create, list, read, scale, update, rotate
the token and destroy."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pydantic

from corral.client._transport import TransportCalls
from corral.client.errors import VALIDATION_PROBLEM, ValidationError
from corral.client.models import Deployment, DeploymentHistory, RouteTable, ServingLoad
from corral.domain.deployment import Autoscaling, DeploymentSpec
from corral.domain.field_errors import describe, field_errors


class DeploymentCalls(TransportCalls):
    """Deployments; mixed into `Client`."""

    async def create_deployment(
        self, spec: DeploymentSpec | None = None, **fields: Any
    ) -> Deployment:
        """Create a deployment: a `DeploymentSpec`, or its fields (`name=`, `image=`,
        `command=`, `replicas=`, `health_check=`...); validated here first."""
        if spec is None:
            spec = validate_deployment(fields)
        elif fields:
            raise TypeError("give a DeploymentSpec or its fields, not both")
        body = spec.model_dump(mode="json", exclude_unset=True)
        return Deployment.model_validate(await self._json("POST", "/v1/deployments", json=body))

    async def list_deployments(self) -> list[Deployment]:
        """Your deployments (admins: everyone's), oldest first, without routes."""
        answer = await self._json("GET", "/v1/deployments")
        return [Deployment.model_validate(item) for item in answer["items"]]

    async def get_deployment(self, deployment: uuid.UUID | str) -> Deployment:
        """One deployment (by name or id) with its routes."""
        return Deployment.model_validate(await self._json("GET", _path(deployment)))

    async def scale_deployment(self, deployment: uuid.UUID | str, replicas: int) -> Deployment:
        """Set a deployment's replica count."""
        path = f"{_path(deployment)}/scale"
        answer = await self._json("POST", path, json={"replicas": replicas})
        return Deployment.model_validate(answer)

    async def update_deployment(
        self,
        deployment: uuid.UUID | str,
        *,
        image: str | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        max_unavailable: int | None = None,
        drain_grace_s: float | None = None,
        autoscaling: Autoscaling | Mapping[str, Any] | None = None,
        stop_autoscaling: bool = False,
    ) -> Deployment:
        """Start a rolling update of the fields given (the others stay). Settings alone
        (max_unavailable, drain_grace_s, autoscaling, stop_autoscaling) change in place: no
        replica replaced."""
        if isinstance(autoscaling, Autoscaling):
            autoscaling = autoscaling.model_dump(mode="json")
        body: dict[str, Any] = {
            key: value
            for key, value in (
                ("image", image),
                ("command", command),
                ("env", env),
                ("max_unavailable", max_unavailable),
                ("drain_grace_s", drain_grace_s),
                ("autoscaling", autoscaling),
            )
            if value is not None
        }
        if stop_autoscaling:
            if autoscaling is not None:
                raise TypeError("give autoscaling or stop_autoscaling, not both")
            body["autoscaling"] = None
        answer = await self._json("POST", f"{_path(deployment)}/update", json=body)
        return Deployment.model_validate(answer)

    async def deployment_history(self, deployment: uuid.UUID | str) -> DeploymentHistory:
        """What the deployment and route handlers did with a deployment and its replicas."""
        answer = await self._json("GET", f"{_path(deployment)}/history")
        return DeploymentHistory.model_validate(answer)

    async def report_proxy_load(
        self, proxy_id: str, table_revision: int, inflight: Mapping[str, Mapping[str, int]]
    ) -> ServingLoad:
        """A proxy's report of its requests in flight per deployment id and replica address
        (admins); the answer sums the live proxies'."""
        body = {"proxy_id": proxy_id, "table_revision": table_revision, "inflight": inflight}
        return ServingLoad.model_validate(await self._json("POST", "/v1/serving/load", json=body))

    async def rotate_deployment_token(self, deployment: uuid.UUID | str) -> str:
        """A new token for a deployment whose access is by token; the old one stops working."""
        answer = await self._json("POST", f"{_path(deployment)}/token")
        token: str = answer["token"]
        return token

    async def route_table(self) -> RouteTable:
        """The healthy route table proxies forward by (admins)."""
        return RouteTable.model_validate(await self._json("GET", "/v1/serving/routes"))

    async def destroy_deployment(self, deployment: uuid.UUID | str) -> Deployment:
        """Destroy a deployment: its replicas end, then it is DESTROYED."""
        return Deployment.model_validate(await self._json("DELETE", _path(deployment)))


def validate_deployment(fields: Mapping[str, Any]) -> DeploymentSpec:
    """The deployment spec of `fields`, its replica's session spec checked too, or
    `ValidationError` naming each bad field (no request)."""
    try:
        spec = DeploymentSpec.model_validate(fields)
        spec.replica_spec()
    except pydantic.ValidationError as exc:
        errors = field_errors(exc)
        raise ValidationError(
            describe(errors),
            type=VALIDATION_PROBLEM,
            title="The deployment spec is not valid",
            errors=errors,
        ) from None
    return spec


def _path(deployment: uuid.UUID | str) -> str:
    return f"/v1/deployments/{quote(str(deployment).strip(), safe='')}"
