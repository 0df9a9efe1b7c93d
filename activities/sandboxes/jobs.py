"""Cold sandboxes: the attempt's Job `<run>-exec-<attempt>`, created (or, made by an earlier try of the same
activity, found again by the uid it recorded), then its pod awaited until ready while heartbeating. The pod is
used only when the Job controls it and it runs the Job's template (activities.sandboxes.ownership); a pod that will
not become ready, or a Job that cannot make one, ends the acquisition with the reason
(activities.sandboxes.failures)."""

import asyncio
from typing import TYPE_CHECKING

from temporalio.exceptions import ApplicationError

from activities.sandboxes.failures import missing_runtime_class, pod_failure, unschedulable
from activities.sandboxes.manifests import job_manifest, pod_ready, sandbox_failed
from activities.sandboxes.ownership import controlled_by, not_the_attempts_job, spec_difference
from kube import ApiError, Obj, path
from workflows.activity_types import SANDBOX_MISCONFIGURED, Sandbox, SandboxRequest
from workflows.contract import ExecutionContract
from workflows.spec import SandboxPolicy

if TYPE_CHECKING:
    from activities.sandboxes.kubernetes import KubernetesSandboxes


class ColdJobs:
    """The cold Jobs of one worker's Kubernetes backend (its client, settings, keys and heartbeat)."""

    def __init__(self, sandboxes: "KubernetesSandboxes") -> None:
        self.sandboxes = sandboxes

    async def start_cold(self, req: SandboxRequest) -> Sandbox:
        contract = req.contract
        ns = contract.run.namespace
        deadline = req.run_seconds + req.timeout_seconds + 60
        token_sha256 = self.sandboxes.keys.sandbox_token_sha256(contract.run)
        manifest = job_manifest(contract, req.policy, self.sandboxes.settings, deadline, token_sha256)
        name = manifest["metadata"]["name"]
        try:
            job = await self.sandboxes.kube.create(path("batch/v1", "jobs", ns), manifest)
        except ApiError as err:
            if err.status != 409:
                raise sandbox_failed(f"cannot create Job {ns}/{name}: {err.message}") from None
            job = await self._made_earlier(ns, name, contract, token_sha256)
        self.sandboxes.heartbeat(
            {"job": name, "uid": job["metadata"]["uid"]}
        )  # a retried try finds its Job by this
        pod = await self.wait_ready(job, req.timeout_seconds, req.policy)
        return Sandbox(name=name, kind="cold", endpoint=self.sandboxes.endpoint(pod))

    async def _made_earlier(self, ns: str, name: str, contract: ExecutionContract, token_sha256: str) -> Obj:
        """The Job already under the attempt's name: an earlier try of this activity made it, or it is not ours."""
        try:
            job = await self.sandboxes.kube.get(path("batch/v1", "jobs", ns, name))
        except ApiError as err:
            raise sandbox_failed(f"Job {ns}/{name} exists but cannot be read: {err.message}") from None
        recorded = self.sandboxes.earlier().get("uid")
        why = not_the_attempts_job(
            job, contract.run.uid, contract.run.attempt, token_sha256, str(recorded) if recorded else None
        )
        if why:
            raise sandbox_failed(f"Job {ns}/{name} exists and is not this attempt's ({why}): it is not used")
        return job

    async def wait_ready(self, job: Obj, within: float, policy: SandboxPolicy) -> Obj:
        """The Job's pod, once ready: a pod it controls, running its template. A pod that only says so (labelled
        for the Job, or adopted by it, running something else) fails the attempt."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = job["spec"]["template"]["spec"]
        loop = asyncio.get_running_loop()
        start = loop.time()
        unschedulable_since: float | None = None
        last = "no pod yet"
        while loop.time() - start < within:
            self.sandboxes.heartbeat({"job": name, "uid": job["metadata"]["uid"], "waiting": last})
            pods = (await self.sandboxes.kube.list(path("v1", "pods", namespace), labels={"job-name": name}))[
                "items"
            ]
            live = [
                p for p in pods if not p["metadata"].get("deletionTimestamp") and controlled_by(p, "Job", job)
            ]
            for pod in live:
                difference = spec_difference(pod["spec"], template)
                if difference:
                    raise sandbox_failed(
                        f"pod {pod['metadata']['name']} is controlled by Job {name} but does not run its template "
                        f"({difference}): not used"
                    )
                if pod_ready(pod):
                    ready: Obj = pod
                    return ready
                failure = pod_failure(pod)
                if failure:
                    raise sandbox_failed(failure)
                why = unschedulable(pod)
                if why:
                    unschedulable_since = unschedulable_since or loop.time()
                    if (
                        loop.time() - unschedulable_since
                        > self.sandboxes.settings.unschedulable_grace_seconds
                    ):
                        raise sandbox_failed(why)
                    last = why
                else:
                    last = f"pod {pod['metadata']['name']} {pod.get('status', {}).get('phase', 'Pending')}"
            if not live:
                await self._job_failure(namespace, name, loop.time() - start, policy)
            await asyncio.sleep(self.sandboxes.settings.poll_seconds)
        raise sandbox_failed(f"Job {namespace}/{name} not ready within {within:.0f}s ({last})")

    async def _job_failure(self, namespace: str, job: str, waited: float, policy: SandboxPolicy) -> None:
        """No pod: the Job failed, or the pod was refused (admission, quota, missing ServiceAccount). A missing
        RuntimeClass fails the run at once; other refusals get a grace period (a ServiceAccount may be coming)."""
        try:
            obj = await self.sandboxes.kube.get(path("batch/v1", "jobs", namespace, job))
        except ApiError as err:
            if err.status == 404:
                raise sandbox_failed(f"Job {namespace}/{job} is gone") from None
            raise
        for condition in obj.get("status", {}).get("conditions", []):
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                raise sandbox_failed(
                    f"Job {namespace}/{job} failed: {condition.get('reason')}: {condition.get('message', '')}"
                )
        if waited < min(1.0, self.sandboxes.settings.pod_creation_grace_seconds):
            return  # the Job controller makes the pod within milliseconds; look at events only when it did not
        events = await self.sandboxes.kube.list(
            path("v1", "events", namespace), fields=f"involvedObject.name={job},involvedObject.kind=Job"
        )
        refused = [e for e in events["items"] if e.get("reason") == "FailedCreate"]
        for event in refused:
            misconfigured = missing_runtime_class(policy, event.get("message", ""))
            if misconfigured:
                raise ApplicationError(misconfigured, type=SANDBOX_MISCONFIGURED, non_retryable=True)
        if refused and waited >= self.sandboxes.settings.pod_creation_grace_seconds:
            raise sandbox_failed(
                f"Job {namespace}/{job} cannot create its pod: {refused[-1].get('message', '')}"
            )
