"""The five deployment handlers of spec document 1, one per file."""

from __future__ import annotations

from corral.handlers.deployments.check_pending import CheckPendingDeploymentHandler
from corral.handlers.deployments.check_replicas import CheckReplicaDeploymentHandler
from corral.handlers.deployments.destroying import DestroyingDeploymentHandler
from corral.handlers.deployments.reconcile import ReconcileDeploymentHandler
from corral.handlers.deployments.scaling import ScalingDeploymentHandler

__all__ = [
    "CheckPendingDeploymentHandler",
    "CheckReplicaDeploymentHandler",
    "DestroyingDeploymentHandler",
    "ReconcileDeploymentHandler",
    "ScalingDeploymentHandler",
]
