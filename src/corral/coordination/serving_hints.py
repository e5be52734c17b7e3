"""The hints of the deployment and route coordinators: one per handler's task."""

from __future__ import annotations

from enum import StrEnum


class ServingHint(StrEnum):
    """A hint per task of the deployment and route coordinators; it only wakes the task."""

    CHECK_PENDING = "deployment-check-pending"
    SCALE = "deployment-scale"
    CHECK_REPLICAS = "deployment-check-replicas"
    RECONCILE = "deployment-reconcile"
    DESTROY = "deployment-destroy"
    DEPLOY = "deployment-deploy"
    AUTOSCALE = "deployment-autoscale"
    PROVISION_ROUTES = "route-provision"
    CHECK_HEALTH = "route-health"
    CHECK_RUNNING_ROUTES = "route-running"
    EVICT_ROUTES = "route-evict"
    TERMINATE_ROUTES = "route-terminate"
    SYNC_DISCOVERY = "route-discovery-sync"
