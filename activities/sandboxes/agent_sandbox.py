"""Warm sandboxes through kubernetes-sigs/agent-sandbox (v1beta1), for clusters that run its controller: a pool with
`backend: agent-sandbox` is a SandboxTemplate and a SandboxWarmPool named like a ReplicaSet pool
(`ksquad-pool-<name>`), whose pod template is the one the chart renders for any pool (ksquad.poolTemplate).

A claim is a SandboxClaim named as the attempt's Job would be (`<run>-exec-<attempt>`), owned by the Run (deleting
the Run deletes it, its Sandbox and its pod), asking agent-sandbox to put the hash of the attempt's caller token in
the pod's annotations (`additionalPodMetadata`), which the agent reads as a pool pod does. The controller adopts a
warm Sandbox of the pool (or makes one from the template when none is ready). The worker trusts what it finds only
by uid, as for its own pools (activities.sandboxes.ownership): the Sandbox the claim's status names is controlled by
the claim, the pod by that Sandbox, and the pod runs the template the chart rendered (never what the live
SandboxTemplate says: an editor of the namespace could change that), on the Run's RuntimeClass, ready, with the
attempt's hash. A pod that is anything else is not used: the claim is deleted and the attempt goes cold.

The sandbox's name in the Run's status is `<claim>/<sandbox>`. Release deletes the claim (agent-sandbox has no
finalizers: Kubernetes' garbage collector removes its Sandbox and pod) and, to confirm, waits until the claim, the
Sandbox and its pod are all gone: deleting the pod alone would have its Sandbox make it again."""

import asyncio
import logging
from typing import TYPE_CHECKING

from temporalio.exceptions import ApplicationError

from activities.metrics import SANDBOX_ACQUIRE_FAILURES
from activities.sandboxes.manifests import (
    ANNOTATION_TOKEN_SHA256,
    LABEL_ATTEMPT,
    LABEL_POOL,
    LABEL_RUN,
    LABEL_RUN_UID,
    PoolRef,
    job_name,
    owner_reference,
    pod_ready,
    sandbox_failed,
)
from activities.sandboxes.ownership import controlled_by, spec_difference
from kube import ApiError, Kube, Obj, path
from workflows.activity_types import SANDBOX_MISCONFIGURED, Sandbox, SandboxRelease
from workflows.contract import ExecutionContract

if TYPE_CHECKING:
    from activities.sandboxes.kubernetes import KubernetesSandboxes

log = logging.getLogger(__name__)
AGENTS = "agents.x-k8s.io/v1beta1"
EXTENSIONS = "extensions.agents.x-k8s.io/v1beta1"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"  # a Sandbox's pod, when not named as the Sandbox


def claim_ready(claim: Obj) -> bool:
    conditions = claim.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def claim_condition(claim: Obj) -> str:
    """What the claim's Ready condition says, for an error message."""
    for c in claim.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return f"Ready={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    return "no Ready condition yet"


def split_name(name: str) -> tuple[str, str | None]:
    """(claim, sandbox) of a claimed sandbox's name `<claim>/<sandbox>`."""
    claim, _, sandbox = name.partition("/")
    return claim, sandbox or None


class AgentSandboxClaims:
    """The claims of one worker's Kubernetes backend (its client, settings, keys and heartbeat)."""

    def __init__(self, sandboxes: "KubernetesSandboxes") -> None:
        self.sandboxes = sandboxes

    async def bind(
        self, pool: PoolRef, pinned: Obj, contract: ExecutionContract, within: float
    ) -> Sandbox | None:
        """Claim a sandbox of the pool for the attempt, or None when what agent-sandbox gave is not the pool's (the
        claim then deleted)."""
        kube, run = self.sandboxes.kube, contract.run
        name = job_name(run.name, run.attempt)
        token_sha256 = self.sandboxes.keys.sandbox_token_sha256(run)
        body = {
            "apiVersion": EXTENSIONS,
            "kind": "SandboxClaim",
            "metadata": {
                "name": name,
                "namespace": run.namespace,
                "labels": {
                    LABEL_RUN: run.name,
                    LABEL_RUN_UID: run.uid,
                    LABEL_ATTEMPT: str(run.attempt),
                    LABEL_POOL: pool.name,
                },
                "ownerReferences": [owner_reference(run)],
            },
            "spec": {
                "warmPoolRef": {"name": pool.replica_set},
                "additionalPodMetadata": {"annotations": {ANNOTATION_TOKEN_SHA256: token_sha256}},
            },
        }
        claims = path(EXTENSIONS, "sandboxclaims", run.namespace)
        try:
            claim = await kube.create(claims, body)
        except ApiError as err:
            if err.status == 404:
                raise ApplicationError(
                    f"pool {pool.name} has backend agent-sandbox, but the cluster serves no SandboxClaims "
                    f"({EXTENSIONS}): install agent-sandbox with its extensions, or set the pool's backend to "
                    "replicaset",
                    type=SANDBOX_MISCONFIGURED,
                    non_retryable=True,
                ) from None
            if err.status != 409:
                raise
            claim = await self._made_earlier(run.namespace, name, contract)
        self.sandboxes.heartbeat({"claim": name, "uid": claim["metadata"]["uid"]})
        found = await self._claimed(claim, pinned, token_sha256, within)
        if isinstance(found, str):
            SANDBOX_ACQUIRE_FAILURES.labels("agent-sandbox-not-the-pools").inc()
            log.warning("%s: claim %s/%s not used: %s", run.name, run.namespace, name, found)
            await self._delete_claim(run.namespace, name)
            return None
        sandbox, pod = found
        log.info("%s: claimed sandbox %s through %s", run.name, sandbox["metadata"]["name"], name)
        return Sandbox(
            name=f"{name}/{sandbox['metadata']['name']}",
            kind="claimed",
            endpoint=self.sandboxes.endpoint(pod),
        )

    async def _made_earlier(self, namespace: str, name: str, contract: ExecutionContract) -> Obj:
        """The claim already under the attempt's name: an earlier try of this activity made it, or it is not ours."""
        claim = await self.sandboxes.kube.get(path(EXTENSIONS, "sandboxclaims", namespace, name))
        recorded = self.sandboxes.earlier().get("uid")
        labels = claim["metadata"].get("labels") or {}
        owners = [o.get("uid") for o in claim["metadata"].get("ownerReferences") or []]
        if (
            recorded != claim["metadata"]["uid"]
            or labels.get(LABEL_RUN_UID) != contract.run.uid
            or labels.get(LABEL_ATTEMPT) != str(contract.run.attempt)
            or contract.run.uid not in owners
        ):
            raise sandbox_failed(
                f"SandboxClaim {namespace}/{name} exists and is not this attempt's (the worker did not make it): "
                "it is not used"
            )
        return claim

    async def _claimed(
        self, claim: Obj, pinned: Obj, token_sha256: str, within: float
    ) -> tuple[Obj, Obj] | str:
        """(Sandbox, pod) once the claim is ready and its pod is the attempt's; a reason when it is not the pool's.
        sandbox_failed when nothing is ready within `within` seconds."""
        kube, settings = self.sandboxes.kube, self.sandboxes.settings
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        waiting = "the claim not ready"
        while loop.time() < deadline:
            self.sandboxes.heartbeat({"claim": name, "uid": claim["metadata"]["uid"], "waiting": waiting})
            try:
                claim = await kube.get(path(EXTENSIONS, "sandboxclaims", namespace, name))
            except ApiError as err:
                if err.status != 404:
                    raise
                # deleted under the worker: its Run's deletion reached it (the garbage collector), or a person
                raise sandbox_failed(
                    f"SandboxClaim {namespace}/{name} was deleted while the worker waited for its sandbox"
                ) from None
            sandbox_name = claim.get("status", {}).get("sandbox", {}).get("name")
            waiting = f"claim {claim_condition(claim)}"
            if claim_ready(claim) and sandbox_name:
                found = await self._pod_of(claim, sandbox_name, pinned, token_sha256)
                if not isinstance(found, str) or found.startswith("not "):
                    return found
                waiting = found  # not yet: its pod not ready or without the attempt's hash yet
            await asyncio.sleep(settings.poll_seconds)
        await self._delete_claim(namespace, name)
        raise sandbox_failed(
            f"SandboxClaim {namespace}/{name} gave no ready sandbox within {within:.0f}s ({waiting})"
        )

    async def _pod_of(
        self, claim: Obj, sandbox_name: str, pinned: Obj, token_sha256: str
    ) -> tuple[Obj, Obj] | str:
        """The claim's Sandbox and pod when they are the attempt's; else why: "not ..." when they never will be,
        anything else while they may still become so."""
        kube, namespace = self.sandboxes.kube, claim["metadata"]["namespace"]
        try:
            sandbox = await kube.get(path(AGENTS, "sandboxes", namespace, sandbox_name))
        except ApiError as err:
            if err.status == 404:
                return f"Sandbox {sandbox_name} not there yet"
            raise
        if not controlled_by(sandbox, "SandboxClaim", claim):
            return f"not the claim's: Sandbox {sandbox_name} is not controlled by SandboxClaim {claim['metadata']['name']}"
        pod_name = (sandbox["metadata"].get("annotations") or {}).get(POD_NAME_ANNOTATION) or sandbox_name
        try:
            pod = await kube.get(path("v1", "pods", namespace, pod_name))
        except ApiError as err:
            if err.status == 404:
                return f"pod {pod_name} not there yet"
            raise
        if not controlled_by(pod, "Sandbox", sandbox):
            return f"not the Sandbox's: pod {pod_name} is not controlled by Sandbox {sandbox_name}"
        difference = spec_difference(pod["spec"], pinned["spec"])
        if difference is not None:
            return f"not the pool's template: pod {pod_name} differs ({difference})"
        if (pod["metadata"].get("annotations") or {}).get(ANNOTATION_TOKEN_SHA256) != token_sha256:
            return f"pod {pod_name} without the attempt's caller hash yet"
        if not pod_ready(pod):
            return f"pod {pod_name} not ready"
        return sandbox, pod

    async def _delete_claim(self, namespace: str, name: str) -> None:
        try:
            await self.sandboxes.kube.delete(
                path(EXTENSIONS, "sandboxclaims", namespace, name), propagation="Foreground"
            )
        except ApiError as err:
            if err.status != 404:
                raise

    async def release(self, rel: SandboxRelease) -> None:
        """Delete the claim; with `confirm`, wait until the claim, its Sandbox and its pod are gone (SandboxNotGone
        after the release timeout: fail closed)."""
        kube, settings = self.sandboxes.kube, self.sandboxes.settings
        namespace = rel.run.namespace
        name, sandbox_name = split_name(rel.sandbox.name)
        await self._delete_claim(namespace, name)
        if not rel.confirm:
            return
        # The pod is named as its Sandbox (agent-sandbox's default, and what the claim checked): a pod killed
        # mid-run is made again under the same name until the Sandbox goes.
        pod_name = sandbox_name
        remaining: list[tuple[str, str]] = [
            (path(EXTENSIONS, "sandboxclaims", namespace, name), "SandboxClaim")
        ]
        if sandbox_name is not None:
            remaining.append((path(AGENTS, "sandboxes", namespace, sandbox_name), "Sandbox"))
        if pod_name is not None:
            remaining.append((path("v1", "pods", namespace, pod_name), "pod"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.release_timeout_seconds
        while loop.time() < deadline:
            self.sandboxes.heartbeat(f"waiting for sandbox {rel.sandbox.name} to be gone")
            remaining = [r for r in remaining if await _exists(kube, r[0])]
            if not remaining:
                return
            await asyncio.sleep(settings.poll_seconds)
        left = [kind for _, kind in remaining]
        raise ApplicationError(
            f"sandbox {namespace}/{rel.sandbox.name} still exists after {settings.release_timeout_seconds:.0f}s "
            f"({', '.join(left)})",
            type="SandboxNotGone",
            non_retryable=True,
        )


async def _exists(kube: Kube, url: str) -> bool:
    try:
        await kube.get(url)
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True
