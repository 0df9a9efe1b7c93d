"""`helm install` of charts/ksquad on the test cluster, as the README tells a user, running from ksquad's images:
the seed's Run applied byte for byte succeeds in a cold sandbox of the agent image; `helm upgrade` mid-run rolls
the pods and the run still succeeds, once; killing the leading bridge hands the Lease to the other replica;
a RuntimeClass the cluster lacks fails a Run at once; `helm uninstall` removes everything the chart made.

The tests of tests/chart/ share one release (tests/chart/conftest.py); each makes what it needs of it (the
credential, the squad, the values it upgrades to) whichever ran before it, and tests/chart/test_uninstall.py,
ordered last of the package (tests/chart/conftest.py), uninstalls it.
"""

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from testbed.agents import MODEL_KEY, ModelEndpoint
from testbed.chart import CHART
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE, KSQUAD_IMAGE
from testbed.isolate import NODE_ADDRESS
from tests.chart.conftest import (
    HOME,
    NS,
    RELEASE,
    SEED_TASK,
    Release,
    edited_squad,
    helm,
    in_place_of,
    phase_of,
    shell_step,
    terminal_events,
    wait_for,
)
from tests.support.install_texts import readme_cluster_steps

# runtimeClass kata mapped to a RuntimeClass the cluster lacks
KATA_NOT_INSTALLED = [
    "--set",
    "sandbox.runtimeClasses.kata=kata-not-installed",
    "--set",
    "sandbox.allowedRuntimeClasses={gvisor,kata}",
]


def test_install_without_namespaces_fails_and_says_what_to_set(ksquad_cluster: ControlPlane) -> None:
    done = helm(ksquad_cluster, "install", "nowhere", str(CHART), "-n", "default", check=False)
    assert done.returncode != 0
    assert "namespaces is empty: set the namespaces your Runs live in" in done.stderr
    assert "--set 'namespaces={ksquad-system,payments}'" in done.stderr
    assert helm(ksquad_cluster, "status", "nowhere", "-n", "default", check=False).returncode != 0, (
        "nothing installed"
    )


def test_the_chart_runs_from_its_images_as_its_service_accounts(release: Release) -> None:
    pods = release.get("pods", "-n", HOME, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    by_component: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_component.setdefault(pod["metadata"]["labels"]["app.kubernetes.io/component"], []).append(pod)
    assert {k: len(v) for k, v in by_component.items()} == {"api": 1, "bridge": 2, "worker": 1}, (
        "two bridge replicas"
    )
    for component, group in by_component.items():
        for pod in group:
            (container,) = pod["status"]["containerStatuses"]
            assert container["ready"] and container["image"] == KSQUAD_IMAGE
            assert pod["spec"]["serviceAccountName"] == f"ksquad-{component}"
            assert pod["status"]["podIP"] != NODE_ADDRESS, "each pod on its own address"
            # The kubelet projected the ServiceAccount's token into the container: read it from inside.
            listed = release.kubectl(
                "exec",
                "-n",
                HOME,
                pod["metadata"]["name"],
                "--",
                "sh",
                "-c",
                "id -u; ls /var/run/secrets/kubernetes.io/serviceaccount",
            ).stdout.split()
            assert listed == ["65532", "ca.crt", "namespace", "token"]
    # And the API server saw each ServiceAccount's identity: the bridge writes the Lease it leads through (and
    # Runs' status), the worker nothing yet; every replica asks for its Lease.
    lease = release.get("lease", "ksquad-bridge", "-n", HOME)
    assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in by_component["bridge"]}
    users = {
        json.loads(line)["user"]["username"]
        for line in release.cluster.audit_log.read_text().splitlines()
        if line.strip()
    }
    assert f"system:serviceaccount:{HOME}:ksquad-bridge" in users


async def test_the_seed_run_succeeds_in_a_cold_sandbox_of_the_agent_image(
    release: Release, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"delay": 3, "text": "Stabilized the payment-retry test."})
    release.kubectl("-n", NS, "delete", "secret", "model-key", "--ignore-not-found")  # another test's, if any
    squad = tmp_path / "cluster-squad.yaml"
    squad.write_text(edited_squad(model))
    # The README's commands after the install, run by a shell (the release was installed by those before).
    steps = readme_cluster_steps()
    steps = in_place_of(
        steps[next(i for i, step in enumerate(steps) if step.startswith("helm install")) + 1 :],
        {
            "sk-...": MODEL_KEY,
            "api.openai.com": urlsplit(model.url).hostname or "",
            "examples/cluster-squad.yaml": str(squad),  # edited as its comment says
            "ksquad-system -w": "ksquad-system",  # one listing instead of a watch
            "--timeout=1h": "--timeout=300s",
        },
    )
    wait_at = next(i for i, step in enumerate(steps) if step.startswith("kubectl wait"))
    for step in steps[:wait_at]:
        await asyncio.to_thread(shell_step, release.cluster, step)  # the model answers from this event loop

    def sandbox_pod() -> dict[str, Any] | None:
        pods = release.get("pods", "-n", NS, "-l", "job-name=fix-flaky-tests-exec-1")["items"]
        statuses = pods[0]["status"].get("containerStatuses") if pods else None
        return pods[0] if statuses and "running" in statuses[0]["state"] else None

    pod = await wait_for("the seed's sandbox pod", sandbox_pod, timeout=120)  # while it runs: it goes after
    waited = await asyncio.to_thread(shell_step, release.cluster, steps[wait_at])
    assert waited.stdout.strip() == "run.ksquad.io/fix-flaky-tests condition met", waited.stdout
    run = await phase_of(release, "fix-flaky-tests", {"Succeeded", "Failed"})
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert status["outputs"] == {"answer": "Stabilized the payment-retry test."}
    assert status["triggeredBy"] == "ksquad-test-admin"
    assert pod["metadata"]["ownerReferences"][0]["name"] == "fix-flaky-tests-exec-1", "a cold sandbox: a Job"
    assert pod["spec"]["containers"][0]["image"] == AGENT_IMAGE
    assert pod["status"]["containerStatuses"][0]["imageID"], "it ran, from the agent image"
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert [c.task for c in model.state.calls] == [SEED_TASK], "one model call, from the sandbox"
    users = {
        json.loads(line)["user"]["username"]
        for line in release.cluster.audit_log.read_text().splitlines()
        if '"jobs"' in line
    }
    assert f"system:serviceaccount:{HOME}:ksquad-worker" in users, (
        "the worker made the Job as its ServiceAccount"
    )
    assert terminal_events(release, run["metadata"]["uid"]) == 1
    assert release.jobs_created("fix-flaky-tests") == ["fix-flaky-tests-exec-1"], (
        "the audit log shows Jobs made"
    )
    # The README's last steps: the Run's Events, the cancel annotation (on a Run that ended: nothing to do), delete.
    events, cancel, delete = [
        await asyncio.to_thread(shell_step, release.cluster, step) for step in steps[wait_at + 1 :]
    ]
    assert "Succeeded" in events.stdout, events.stdout
    assert "annotated" in cancel.stdout and "deleted" in delete.stdout, (cancel.stdout, delete.stdout)
    assert release.cluster.kubectl("get", "run", "fix-flaky-tests", "-n", NS, check=False).returncode != 0


async def test_helm_upgrade_mid_run_rolls_the_pods_and_the_run_succeeds_once(
    release: Release, model: ModelEndpoint
) -> None:
    # The model thinks for 40 s: the upgrade replaces the worker (and the bridges) while the agent waits on it.
    model.script("dev-model", {"delay": 40, "text": "Done across an upgrade."})
    release.ensure_credential(model)
    release.squad(model)
    task = "Survive a helm upgrade."
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Run",
                "metadata": {"name": "across-upgrade", "namespace": NS},
                "spec": {"agents": ["dev-1"], "inputs": {"task": task}, "workItemRef": "wi-upgrade"},
            }
        ),
    )
    await wait_for("the model to be called", lambda: any(c.task == task for c in model.state.calls), 120)
    selector = f"app.kubernetes.io/instance={RELEASE}"
    before = {p["metadata"]["name"] for p in release.get("pods", "-n", HOME, "-l", selector)["items"]}
    changed = [
        *KATA_NOT_INSTALLED,
        "--set",
        "bridge.resources.requests.cpu=60m",
        "--set",
        "api.resources.requests.cpu=60m",  # (the API's pod template changes too: every pod rolls)
    ]
    await release.upgrade(changed)

    def replaced() -> set[str] | None:
        names = {p["metadata"]["name"] for p in release.get("pods", "-n", HOME, "-l", selector)["items"]}
        return names if not names & before else None

    after = await wait_for("every pod of the release to be replaced", replaced, timeout=120)
    assert len(after) == 4, after

    run = await phase_of(release, "across-upgrade", {"Succeeded", "Failed"}, timeout=240)
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert status["attempt"] == 1
    assert [c.task for c in model.state.calls].count(task) == status["attempt"], "one model call per attempt"
    workflows = [w async for w in release.temporal.list_workflows(f"WorkflowId = '{NS}/across-upgrade'")]
    assert len(workflows) == 1, "one workflow"
    assert terminal_events(release, run["metadata"]["uid"]) == 1, "one terminal phase"


async def test_a_runtime_class_the_cluster_lacks_fails_the_run_once_with_the_reason(
    release: Release, model: ModelEndpoint
) -> None:
    # runtimeClass kata mapped to a RuntimeClass nobody installed (the upgrade test's values map it so already).
    if "sandbox.runtimeClasses.kata=kata-not-installed" not in release.values:
        await release.upgrade(KATA_NOT_INSTALLED)
    release.ensure_credential(model)
    release.squad(model)
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Run",
                "metadata": {"name": "needs-kata", "namespace": NS},
                "spec": {"agents": ["dev-1"], "sandboxPolicy": {"runtimeClass": "kata"}},
            }
        ),
    )
    status = (await phase_of(release, "needs-kata", {"Succeeded", "Failed"}, timeout=60))["status"]
    assert (status["phase"], status["reason"], status["attempt"]) == ("Failed", "SandboxMisconfigured", 1)
    assert 'RuntimeClass "kata-not-installed" does not exist' in status["message"]
    assert "sandbox.runtimeClasses.kata" in status["message"]


def refused(release: Release, doc: dict[str, Any], kubeconfig: Path | None = None) -> str:
    """`kubectl apply` of `doc` (as the admin, or as `kubeconfig`'s user): the API server's refusal."""
    done = release.cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(doc), check=False, kubeconfig=kubeconfig
    )
    assert done.returncode != 0, f"applied: {done.stdout}"
    return done.stderr


def agent(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"modelEndpointRef": "openai", "systemPrompt": "You help.", **spec},
    }


def run(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"agents": ["dev-1"], **spec},
    }


async def test_a_run_author_reads_no_secret_and_leaves_no_sandbox_runtime_or_image(
    release: Release, model: ModelEndpoint
) -> None:
    release.ensure_credential(model)
    release.squad(model)  # the Agents below use its ModelEndpoint, its Runs its Agent dev-1
    # A Secret of the namespace that is not a credential: naming it gets the Run refused, naming the label.
    release.kubectl("-n", NS, "create", "secret", "generic", "db-password", "--from-literal=apiKey=hunter2")
    release.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(agent("thief", credentialSecretRef={"name": "db-password"}))
    )
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(run("steal", agents=["thief"])))
    status = (await phase_of(release, "steal", {"Failed", "Succeeded"}, timeout=60))["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidReferences")
    assert "Secret ksquad-system/db-password is not labelled ksquad.io/credential=true" in status["message"]
    assert release.jobs_created("steal") == [], "no sandbox was made, not even one deleted since"
    # Images and runtime classes outside the chart's allow-lists are refused by the API server, named.
    message = refused(release, agent("own-image", image="docker.io/attacker/agent:1"))
    assert "spec.image docker.io/attacker/agent:1 is not allowed here" in message
    message = refused(release, run("no-gvisor", sandboxPolicy={"runtimeClass": "runc"}))
    assert "spec.sandboxPolicy.runtimeClass runc is not allowed here" in message
    # An endpoint outside agents.allowedEndpoints (empty: none) is never called: the Run is refused.
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(agent("ssrf", endpoint="http://10.0.0.1:443/")))
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(run("probe", agents=["ssrf"])))
    status = (await phase_of(release, "probe", {"Failed", "Succeeded"}, timeout=60))["status"]
    assert (
        status["reason"] == "InvalidReferences"
        and "endpoint http://10.0.0.1:443/ is not allowed" in status["message"]
    )


async def test_killing_the_leading_bridge_hands_the_lease_to_the_other_within_its_duration(
    release: Release,
) -> None:
    lease = release.get("lease", "ksquad-bridge", "-n", HOME)["spec"]
    leader = lease["holderIdentity"]
    bridges = {
        p["metadata"]["name"]
        for p in release.get("pods", "-n", HOME, "-l", "app.kubernetes.io/component=bridge")["items"]
    }
    (other,) = bridges - {leader}
    killed = datetime.now(UTC)
    release.kubectl("delete", "pod", leader, "-n", HOME, "--grace-period=0", "--force")

    def taken() -> dict[str, Any] | None:
        spec: dict[str, Any] = release.get("lease", "ksquad-bridge", "-n", HOME)["spec"]
        # "" is the Lease given up: a force-deleted pod's container still gets SIGTERM, and a bridge stopping
        # gives its Lease up (crd_bridge.leader.release); taken is a replica's name.
        return spec if spec["holderIdentity"] not in (leader, "") else None

    spec = await wait_for("another replica to take the Lease", taken, timeout=60)
    # The standby has been asking all along; the Deployment's replacement for the dead pod may ask in time too.
    live = {
        p["metadata"]["name"]
        for p in release.get("pods", "-n", HOME, "-l", "app.kubernetes.io/component=bridge")["items"]
    }
    assert spec["holderIdentity"] in live - {leader}
    print(f"[leader hand-over] to {'the standby' if spec['holderIdentity'] == other else 'the replacement'}")
    handed_over = (_time(spec["acquireTime"]) - killed).total_seconds()
    print(f"[leader hand-over] {handed_over:.1f}s after the leader was killed", flush=True)
    # The dead leader renewed at most renew_seconds (5) before it died: the Lease is free at most its duration
    # (15 s) after the kill, and the standby asks every 2 s (the same machine's clock: no skew to allow for).
    assert handed_over <= lease["leaseDurationSeconds"] + 2 + 1


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
