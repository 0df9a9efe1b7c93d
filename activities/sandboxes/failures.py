"""What a sandbox's pod says when it will not become ready: a container that cannot start, crashed, ran out of
memory or ended; a pod the scheduler cannot place; a pod refused for want of its RuntimeClass. Each, a reason in
words for the Run's status."""

import re

from kube import Obj
from workflows.spec import SandboxPolicy

FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}


def pod_failure(pod: Obj) -> str | None:
    """Why this pod will not become ready, or None while it still may."""
    status = pod.get("status", {})
    name = pod["metadata"]["name"]
    statuses = status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    for cs in statuses:
        state = cs.get("state", {})
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return f"pod {name}: container {cs['name']}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(
                ": "
            )
        terminated = state.get("terminated") or cs.get("lastState", {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return f"pod {name}: container {cs['name']} was OOMKilled (raise its memory limit)"
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"pod {name}: container {cs['name']} exited with code {terminated['exitCode']} ({terminated.get('reason', 'Error')})"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"pod {name} ended ({status.get('phase')}: {status.get('reason', '')} {status.get('message', '')})".strip()
    return None


def unschedulable(pod: Obj) -> str | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"pod {pod['metadata']['name']} cannot be scheduled: {condition.get('message', condition.get('reason'))}"
    return None


def missing_runtime_class(policy: SandboxPolicy, refused: str) -> str | None:
    """The reason to give when a sandbox pod was refused for want of its RuntimeClass, else None."""
    found = re.search(r'RuntimeClass "([^"]+)" not found', refused)
    if not found:
        return None
    name = found.group(1)
    return (
        f'RuntimeClass "{name}" does not exist in this cluster (Run spec.sandboxPolicy.runtimeClass '
        f"{policy.runtime_class} -> chart value sandbox.runtimeClasses.{policy.runtime_class}): install it "
        f'(docs/operating.md, "Sandbox runtimes"), or set sandbox.runtimeClasses.{policy.runtime_class} to a '
        f"RuntimeClass the cluster has (null: the nodes' default runtime)"
    )
