"""ksquad's images (`make images`), run as pods of the test cluster: each entry point works from the image (not
from the virtualenv), as the image's own user, and the image holds every module of the source tree."""

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE, KSQUAD_IMAGE

ROOT = Path(__file__).parents[2]
PACKAGES = {
    "workflows": "workflows",
    "temporal_client": "temporal_client",
    "activities": "activities",
    "store": "store",
    "api": "api",
    "worker": "worker",
    "dev": "dev",
    "cli": "cli",
    "kube": "kube",
    "agent": "agent",
    "crd_bridge": "crd-bridge/crd_bridge",
}
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


SECTION = "--- entry point ---"


def run_pod(cluster: ControlPlane, namespace: str, name: str, image: str, command: list[str]) -> str:
    """Run `command` in a pod of `image` (the image's own user, read-only root); its output, once it exited 0."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": command,
                    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def ended() -> dict[str, Any] | None:
        got: dict[str, Any] = json.loads(
            cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
        )
        return got if got.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    status = wait_for(f"pod {name} to finish", ended)["status"]
    output = cluster.kubectl("logs", name, "-n", namespace).stdout
    assert status["phase"] == "Succeeded", f"{name}: {json.dumps(status)[:1500]}\n{output}"
    return output


def test_each_entry_point_of_the_ksquad_image_runs_from_the_image(
    ksquad_cluster: ControlPlane, namespace: str
) -> None:
    entry_points = (
        ("ksquad-worker", "KSQUAD_DATABASE_URL"),
        ("ksquad-bridge", "KSQUAD_WATCH_NAMESPACES"),
        ("ksquad", "usage: ksquad"),
    )
    # One pod for all of them (a pod of this image takes seconds to start on the test node): each prints where it
    # was found and its help, after a line of its own.
    script = "set -e; id -u; " + "".join(
        f"echo '{SECTION}'; command -v {command}; {command} --help; " for command, _ in entry_points
    )
    output = run_pod(ksquad_cluster, namespace, "entry-points", KSQUAD_IMAGE, ["sh", "-c", script])
    user, *sections = output.split(f"{SECTION}\n")
    assert user.strip() == "65532"
    assert len(sections) == len(entry_points), output
    for (command, words), section in zip(entry_points, sections, strict=True):
        path, _, text = section.partition("\n")
        assert path == f"/opt/ksquad/bin/{command}", "the image's own install, not a virtualenv of the host"
        assert words in text


def test_the_agent_image_serves_its_agent_card(ksquad_cluster: ControlPlane, namespace: str) -> None:
    # No command: the image's default one (ksquad-agent on port 8080).
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "agent",
                    "image": AGENT_IMAGE,
                    "securityContext": {"readOnlyRootFilesystem": True},
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
                }
            ]
        },
    }
    ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def ready() -> str | None:
        got = json.loads(ksquad_cluster.kubectl("get", "pod", "agent", "-n", namespace, "-o", "json").stdout)
        conditions = got.get("status", {}).get("conditions", [])
        return (
            got["status"]["podIP"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            else None
        )

    ip = wait_for("the agent to be ready", ready)
    with urllib.request.urlopen(f"http://{ip}:8080/.well-known/agent-card.json", timeout=10) as response:
        card = json.loads(response.read())
    assert card["name"] == "ksquad-agent"
    assert card["capabilities"]["streaming"] is True


def test_the_images_hold_every_module_of_the_source_tree(
    ksquad_cluster: ControlPlane, namespace: str
) -> None:
    script = (
        "import importlib.util, pathlib, sys; root = pathlib.Path(importlib.util.find_spec('worker').origin).parents[1];"
        "[print(p.relative_to(root)) for p in sorted(root.rglob('*')) if p.suffix in ('.py', '.mako') and p.parts[len(root.parts)] in sys.argv[1:]]"
    )
    listed = run_pod(ksquad_cluster, namespace, "modules", KSQUAD_IMAGE, ["python3", "-c", script, *PACKAGES])
    installed = set(listed.split())
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", *PACKAGES.values()], capture_output=True, text=True, check=True
    ).stdout.split()
    source = {f.replace("crd-bridge/", "", 1) for f in tracked if f.endswith((".py", ".mako"))}
    assert source - installed == set(), "modules of the source missing from the image"
