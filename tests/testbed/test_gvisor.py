"""The test node runs RuntimeClass `gvisor` under gVisor (testbed/node.py, testbed/runsc-for-containerd.sh): a
process in such a pod sees gVisor's kernel, not the host's, and the pod's containers live and end as under runc:
their output reaches the pod's log, their exit status the Job, and a deleted pod goes at once."""

import os
import time
from pathlib import Path

from testbed.controlplane import ControlPlane
from testbed.images import KSQUAD_IMAGE
from tests.testbed.test_control_plane import PY, apply, get, wait_for


def test_a_gvisor_pod_sees_gvisors_kernel_and_ends_with_its_containers_status(
    ksquad_cluster: ControlPlane, namespace: str
) -> None:
    cluster = ksquad_cluster
    program = "import os, sys; print(open('/proc/version').read().strip(), os.uname().release, flush=True); sys.exit(7)"
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "sandboxed"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "runtimeClassName": "gvisor",
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "main", "image": KSQUAD_IMAGE, "command": [PY, "-c", program]}
                        ],
                    }
                },
            },
        },
    )
    # A second pod, running until it is deleted: the kubelet stops it as it stops a runc container.
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "long"},
            "spec": {
                "runtimeClassName": "gvisor",
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "main", "image": KSQUAD_IMAGE, "command": ["sleep", "600"]}],
            },
        },
    )

    def failed() -> bool:
        conditions = get(cluster, "job", "sandboxed", "-n", namespace).get("status", {}).get("conditions", [])
        return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)

    wait_for("the Job to fail", failed, timeout=90)
    (pod,) = get(cluster, "pods", "-n", namespace, "-l", "job-name=sandboxed")["items"]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"], terminated["reason"]) == ("Failed", 7, "Error")
    logged = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
    host = Path("/proc/version").read_text().strip()
    assert logged.startswith("Linux version 4.4.0 ") and logged.split()[-1] == "4.4.0", logged
    assert host not in logged and os.uname().release != "4.4.0", "gVisor's kernel, not the host's"

    wait_for(
        "the long pod to run",
        lambda: get(cluster, "pod", "long", "-n", namespace)["status"].get("phase") == "Running",
    )
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "long", "-n", namespace, "--wait=true", "--timeout=60s")
    # As PID 1, sleep ignores SIGTERM: SIGKILL ends it after the grace period, as under runc.
    assert time.monotonic() - started < 5 + 5
