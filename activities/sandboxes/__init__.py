"""Sandboxes: where an attempt's agent runs. Backends `kubernetes` (warm pods from pools, else cold Jobs) and
`local` (the reference agent as a local process, for the embedded default).

Kubernetes:
- warm: a pool is a ReplicaSet of ready agent pods labelled `ksquad.io/state=warm`, one of the chart's (the
  worker's settings name them). Claiming one is a single merge patch guarded by the pod's resourceVersion
  (`state=bound`, `run=<run>`, owner = the Run, the caller token's hash): the pod leaves the ReplicaSet's
  selector, the ReplicaSet makes a replacement, and a second claimer of the same pod gets 409 Conflict and moves
  to the next pod. A warm pod gets its contract in the first A2A message. Only pods the pool's ReplicaSet
  controls, running its template on the Run's RuntimeClass, are claimed (activities.sandboxes.ownership).
- cold: a Job `<run>-exec-<attempt>` owned by the Run: no prompt or input in its spec (the contract comes in the
  first A2A message; the pod knows only the hash of the token that may send it), credentials by secretKeyRef only,
  non-root, no service-account token, runtimeClassName, resources, a deadline and a TTL. Skills with
  requirements force cold: init containers stage toolchains into a shared volume, sidecars run beside.
- readiness is awaited while heartbeating; pod failures (image pull, unschedulable, OOMKilled, crash,
  refused by admission) end the acquisition with their reason.
- release deletes; with `confirm` (the fence step) it waits until the pod is gone, and fails when it
  cannot tell.
"""

from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

import tracing
from activities.metrics import SANDBOX_ACQUIRE_FAILURES, SANDBOX_ACQUIRE_SECONDS, since_scheduled
from activities.sandboxes.kubernetes import KubernetesSandboxes
from activities.sandboxes.local import LocalModel, LocalSandboxes
from activities.sandboxes.manifests import (
    ContainerSpec,
    PoolRef,
    SandboxSettings,
    job_manifest,
    job_name,
    owner_reference,
    pod_ready,
)
from kube import Unreachable
from workflows.activity_types import (
    Activity,
    OutputsRequest,
    PublishedOutputs,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)

__all__ = [
    "Backend",
    "ContainerSpec",
    "KubernetesSandboxes",
    "LocalModel",
    "LocalSandboxes",
    "PoolRef",
    "SandboxActivities",
    "SandboxSettings",
    "job_manifest",
    "job_name",
    "owner_reference",
    "pod_ready",
]

Backend = KubernetesSandboxes | LocalSandboxes


class SandboxActivities:
    """The sandbox activities of the Run workflow, over one backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.backend.heartbeat = self._heartbeat
        if isinstance(backend, KubernetesSandboxes):
            backend.earlier = self._earlier

    @staticmethod
    def _heartbeat(*details: Any) -> None:
        if activity.in_activity():
            activity.heartbeat(*details)

    @staticmethod
    def _earlier() -> dict[str, Any]:
        """What an earlier try of this activity heartbeat last (the Job it made), {} when none."""
        details = activity.info().heartbeat_details if activity.in_activity() else ()
        return dict(details[0]) if details and isinstance(details[0], dict) else {}

    @activity.defn(name=Activity.ACQUIRE_SANDBOX)
    async def acquire_sandbox(self, req: SandboxRequest) -> Sandbox:
        try:
            sandbox = await self.backend.acquire(req)
        except Unreachable as err:
            SANDBOX_ACQUIRE_FAILURES.labels("KubernetesUnreachable").inc()
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None
        except ApplicationError as err:
            SANDBOX_ACQUIRE_FAILURES.labels(err.type or "ApplicationError").inc()
            raise
        SANDBOX_ACQUIRE_SECONDS.labels(sandbox.kind).observe(since_scheduled())
        run = req.warrant.run_ref
        tracing.annotate(
            {
                "ksquad.sandbox.name": sandbox.name,
                "ksquad.sandbox.kind": sandbox.kind,
                "ksquad.sandbox.runtime_class": req.policy.runtime_class,
                **tracing.run_attributes(run.namespace, run.name, run.uid, run.triggered_by, req.attempt),
            }
        )
        return sandbox

    @activity.defn(name=Activity.RELEASE_SANDBOX)
    async def release_sandbox(self, rel: SandboxRelease) -> None:
        try:
            await self.backend.release(rel)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    @activity.defn(name=Activity.PUBLISH_OUTPUTS)
    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        try:
            return await self.backend.publish_outputs(req)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    def all(self) -> list[Callable[..., Any]]:
        return [self.acquire_sandbox, self.release_sandbox, self.publish_outputs]
