"""The Kubernetes backend: warm pods claimed from pools (activities.sandboxes.pools), else cold Jobs
(activities.sandboxes.jobs); released and confirmed gone; the outputs published. A pod is used only when Kubernetes
says it is the attempt's Job's or a pool's (activities.sandboxes.ownership), and the agent in it answers only the
caller holding the attempt's token (its hash goes into the pod's annotations)."""

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.agents.callers import CallerKeys, process_keys
from activities.sandboxes.jobs import ColdJobs
from activities.sandboxes.manifests import (
    LABEL_ATTEMPT,
    LABEL_RUN,
    LABEL_RUN_UID,
    MAX_OUTPUTS_BYTES,
    SandboxSettings,
    config_key,
    owner_reference,
    small_outputs,
)
from activities.sandboxes.pools import WarmPools
from kube import ApiError, Kube, Obj, path
from workflows.activity_types import (
    OutputsRequest,
    PublishedOutputs,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)

# Answers to a delete that say no (Forbidden: RBAC or an admission policy; Invalid; BadRequest), not "not now".
REFUSALS = frozenset({400, 403, 422})
RBAC_SETTLING_SECONDS = (1, 2, 4, 8)  # a 403 from RBAC is asked again after these (see release)


class KubernetesSandboxes:
    """The Kubernetes backend of one worker: a warm pod of a pool that serves the Run, else a cold Job."""

    def __init__(
        self,
        kube: Kube,
        settings: SandboxSettings,
        heartbeat: Callable[..., None] = lambda *_: None,
        keys: CallerKeys | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.heartbeat = heartbeat
        # What an earlier try of this activity recorded in its heartbeat (the Job it made), {} when none.
        self.earlier: Callable[[], dict[str, Any]] = dict
        self.keys = keys or process_keys()
        self.pools = WarmPools(self)  # warm pods of the chart's pools, and which pool serves a Run
        self.jobs = ColdJobs(self)  # cold Jobs, when no pool serves one

    async def close(self) -> None:
        await self.pools.close()

    # --- acquire ------------------------------------------------------------------------------------------

    async def acquire(self, req: SandboxRequest) -> Sandbox:
        contract, policy = req.contract, req.policy
        if policy.class_ == "interactive" and not contract.agent.forces_cold and not contract.agent.image:
            warm = await self.pools.bind_warm(contract, policy, req.timeout_seconds)
            if warm is not None:
                return warm
        return await self.jobs.start_cold(req)

    def endpoint(self, pod: Obj) -> str:
        return f"http://{pod['status']['podIP']}:{self.settings.port}/"

    # --- release ------------------------------------------------------------------------------------------

    async def release(self, rel: SandboxRelease) -> None:
        if rel.sandbox.kind == "claimed":
            await self.pools.claims.release(rel)
            return
        ns, name = rel.run.namespace, rel.sandbox.name
        for wait in (*RBAC_SETTLING_SECONDS, None):
            try:
                if rel.sandbox.kind == "warm":
                    await self.kube.delete(
                        path("v1", "pods", ns, name), grace_seconds=self.settings.termination_grace_seconds
                    )
                    selector = None
                else:
                    await self.kube.delete(path("batch/v1", "jobs", ns, name), propagation="Background")
                    selector = f"job-name={name}"
                break
            except ApiError as err:
                if err.status not in REFUSALS:
                    raise
                if err.status == 403 and "admission" not in err.message.lower() and wait is not None:
                    # An API server that just started answers before its RBAC caches are filled: RBAC's
                    # "cannot delete" then is not yet its last word. Asked again a few times.
                    self.heartbeat(
                        f"the API server refused to delete sandbox {name}: asking again in {wait} s"
                    )
                    await asyncio.sleep(wait)
                    continue
                # RBAC or an admission policy said no: asking again gets the same answer; the run fails closed.
                raise ApplicationError(
                    f"the API server refused to delete sandbox {ns}/{name}: {err}"[:2000],
                    type="SandboxDeleteRefused",
                    non_retryable=True,
                ) from None
        if not rel.confirm:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.release_timeout_seconds
        while loop.time() < deadline:
            self.heartbeat(f"waiting for sandbox {name} to be gone")
            if selector is None:
                try:
                    await self.kube.get(path("v1", "pods", ns, name))
                    gone = False
                except ApiError as err:
                    if err.status != 404:
                        raise
                    gone = True
            else:
                pods = (await self.kube.list(path("v1", "pods", ns), labels=selector))["items"]
                gone = not [p for p in pods if _job_of(p) == name]
            if gone:
                return
            await asyncio.sleep(self.settings.poll_seconds)
        # Fail closed: a retry must not start while the old sandbox may still act. Not retried: this already
        # waited the operator's release timeout, and ten more would keep the Run in a phase that lies for an
        # hour (a Job's pod held by a finalizer or a stuck node does not go by being asked again).
        raise ApplicationError(
            f"sandbox {ns}/{name} still exists after {self.settings.release_timeout_seconds:.0f}s",
            type="SandboxNotGone",
            non_retryable=True,
        )

    # --- outputs ------------------------------------------------------------------------------------------

    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        """A small map for status; with `outputs_config_map`, also the full outputs in ConfigMap `<run>-outputs`
        (owned by the Run)."""
        size = sum(len(k) + len(v.encode()) for k, v in req.outputs.items())
        if size > MAX_OUTPUTS_BYTES:
            raise ApplicationError(
                f"outputs are {size} bytes, more than the {MAX_OUTPUTS_BYTES} allowed",
                type="OutputsTooLarge",
                non_retryable=True,
            )
        if not self.settings.outputs_config_map:
            return PublishedOutputs(outputs=small_outputs(req.outputs))
        name = f"{req.run.name}-outputs"
        ns = req.run.namespace
        owner = owner_reference(req.run)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": ns,
                "ownerReferences": [owner],
                "labels": {
                    LABEL_RUN: req.run.name,
                    LABEL_RUN_UID: req.run.uid,
                    LABEL_ATTEMPT: str(req.attempt),
                },
            },
            "data": {config_key(k): v for k, v in req.outputs.items()},
        }
        try:
            await self.kube.create(path("v1", "configmaps", ns), body)
        except ApiError as err:
            if err.status != 409:
                raise
            await self.kube.replace(path("v1", "configmaps", ns, name), body)
        return PublishedOutputs(outputs=small_outputs(req.outputs), config_map=name)


def _job_of(pod: Obj) -> str | None:
    """The Job a pod's controller reference names (a pod anyone labelled job-name=<name> does not count)."""
    for ref in pod["metadata"].get("ownerReferences", []):
        if ref.get("controller") and ref.get("kind") == "Job":
            return str(ref.get("name"))
    return None
