"""mirror_status on the real API server: newer revisions win, older ones are dropped, Events aggregate; and only
the execution of the Run's workflow the bridge recorded writes its status (a copy's is refused, with an Event)."""

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from crd_bridge.activities import BridgeActivities
from crd_bridge.status import RunStatusWriter
from kube import Config, Kube, path
from testbed.controlplane import ControlPlane
from workflows.status import Phase, PhaseEvent, RunStatus, StatusSnapshot, WorkflowRef

RUN_API = "ksquad.io/v1alpha1"


@pytest.fixture
async def bridge(ksquad_cluster: ControlPlane) -> AsyncIterator[BridgeActivities]:
    async with Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube:
        yield BridgeActivities(kube, RunStatusWriter(kube, "test-bridge"))


def make_run(cluster: ControlPlane, namespace: str, name: str) -> str:
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": RUN_API,
                "kind": "Run",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"agents": ["dev-1"]},
            }
        ),
    )
    return str(
        json.loads(cluster.kubectl("get", "kr", name, "-n", namespace, "-o", "json").stdout)["metadata"][
            "uid"
        ]
    )


def snapshot(
    namespace: str, name: str, uid: str, revision: int, phase: Phase, **events: str
) -> StatusSnapshot:
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC) + timedelta(seconds=revision)
    return StatusSnapshot(
        namespace=namespace,
        name=name,
        uid=uid,
        status=RunStatus(phase=phase, revision=revision, message=f"r{revision}", observed_generation=1),
        events=[
            PhaseEvent(revision=revision, phase=phase, reason=reason, message=message, at=at)
            for reason, message in events.items()
        ],
    )


async def test_a_lower_revision_never_overwrites_a_higher_one(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    uid = make_run(ksquad_cluster, namespace, "mirror")
    await bridge.status.mirror(snapshot(namespace, "mirror", uid, 5, Phase.RUNNING))
    await bridge.status.mirror(snapshot(namespace, "mirror", uid, 3, Phase.CLAIMING))  # late, retried
    status = (await bridge.kube.get(path(RUN_API, "runs", namespace, "mirror")))["status"]
    assert (status["phase"], status["revision"], status["observedGeneration"]) == ("Running", 5, 1)
    await bridge.status.mirror(snapshot(namespace, "mirror", uid, 6, Phase.SUCCEEDED))
    status = (await bridge.kube.get(path(RUN_API, "runs", namespace, "mirror")))["status"]
    assert (status["phase"], status["revision"]) == ("Succeeded", 6)


async def test_a_snapshot_of_another_run_with_the_same_name_is_dropped(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    make_run(ksquad_cluster, namespace, "reborn")
    await bridge.status.mirror(snapshot(namespace, "reborn", str(uuid.uuid4()), 9, Phase.FAILED))
    assert "status" not in await bridge.kube.get(path(RUN_API, "runs", namespace, "reborn"))


async def test_events_aggregate_and_a_retried_snapshot_is_not_counted_twice(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    uid = make_run(ksquad_cluster, namespace, "story")
    for revision in (1, 2, 2, 3):  # the third is a retry of the second
        await bridge.status.mirror(
            snapshot(
                namespace, "story", uid, revision, Phase.PAUSED, RateLimited="rate limited; resuming soon"
            )
        )
    events = json.loads(ksquad_cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    (event,) = [e for e in events if e["involvedObject"]["name"] == "story"]
    assert (event["reason"], event["count"]) == ("RateLimited", 3)
    assert event["involvedObject"]["uid"] == uid
    assert event["message"] == "Paused: rate limited; resuming soon"


async def test_events_of_one_second_keep_their_order(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    # firstTimestamp and lastTimestamp have whole seconds: Events of one second sorted out of order.
    uid = make_run(ksquad_cluster, namespace, "quick")
    start = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    phases = [(Phase.PENDING, "Created"), (Phase.CLAIMING, "Claiming"), (Phase.RUNNING, "Running")]
    for i, (phase, reason) in enumerate(phases):
        at = start.replace(microsecond=(3 - i) * 1000 + i * 300_000)  # all in one second, out of name order
        event = PhaseEvent(revision=i + 1, phase=phase, reason=reason, message=reason, at=at)
        status = RunStatus(phase=phase, revision=i + 1, observed_generation=1)
        await bridge.status.mirror(
            StatusSnapshot(namespace=namespace, name="quick", uid=uid, status=status, events=[event])
        )
    table = ksquad_cluster.kubectl("events", "-n", namespace, "--for", "run/quick").stdout.splitlines()
    reasons = [line.split()[2] for line in table[1:]]  # LAST SEEN, TYPE, REASON, OBJECT, MESSAGE
    assert reasons == ["Created", "Claiming", "Running"], table


async def test_events_carry_no_answer_question_or_agent_failure_which_only_the_runs_readers_see(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    """Events are readable with the built-in `view` role, which cannot read Runs: the agent's words stay in the
    Run's status."""
    uid = make_run(ksquad_cluster, namespace, "secretive")
    marker = "AGENT-WORDS-51c7"
    for revision, phase, reason in (
        (1, Phase.PAUSED, "InputRequired"),  # the model's question
        (2, Phase.PENDING, "RetryBackoff"),  # a failed attempt, in the agent's words
        (3, Phase.FAILED, "AgentFailed"),
        (4, Phase.SUCCEEDED, "Succeeded"),  # the answer
    ):
        await bridge.status.mirror(
            snapshot(namespace, "secretive", uid, revision, phase, **{reason: f"{marker}: {reason}"})
        )
    ksquad_cluster.kubectl("create", "serviceaccount", "viewer", "-n", namespace)
    ksquad_cluster.kubectl(
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:viewer",
        "-n",
        namespace,
    )
    token = ksquad_cluster.kubectl("create", "token", "viewer", "-n", namespace).stdout.strip()
    viewer = ksquad_cluster.token_kubeconfig(f"viewer-{namespace}", token, namespace)
    events = json.loads(
        ksquad_cluster.kubectl("get", "events", "-n", namespace, "-o", "json", kubeconfig=viewer).stdout
    )["items"]
    messages = [e["message"] for e in events if e["involvedObject"]["name"] == "secretive"]
    assert len(messages) == 4 and not [m for m in messages if marker in m], messages
    assert "Succeeded: Succeeded (the message is in the Run's status)" in messages
    denied = ksquad_cluster.kubectl("get", "kr", "secretive", "-n", namespace, kubeconfig=viewer, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr, "view reads Events, not Runs"


def as_execution(workflow_id: str, run_id: str) -> ActivityEnvironment:
    """An activity environment whose activity runs for that workflow run, as the server would say."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=workflow_id, workflow_run_id=run_id)
    return env


async def test_only_the_recorded_execution_writes_the_runs_status_and_a_copy_is_told_in_an_event(
    bridge: BridgeActivities, ksquad_cluster: ControlPlane, namespace: str
) -> None:
    uid = make_run(ksquad_cluster, namespace, "owned")
    own = snapshot(namespace, "owned", uid, 1, Phase.RUNNING)
    own.status.workflow = WorkflowRef(id=f"{namespace}/owned", run_id="run-1", first_run_id="run-1")
    await as_execution(f"{namespace}/owned", "run-1").run(bridge.mirror_status, own)
    status = (await bridge.kube.get(path(RUN_API, "runs", namespace, "owned")))["status"]
    assert (status["revision"], status["workflow"]["firstRunId"]) == (1, "run-1"), (
        "the first writer's execution"
    )

    copy = snapshot(
        namespace, "owned", uid, 99, Phase.FAILED
    )  # a higher revision: it would freeze the status
    for workflow_id, run_id, claimed in (
        (f"{namespace}/owned", "run-2", None),  # the same id, after the Run's workflow closed
        (f"{namespace}/owned", "run-2", "run-1"),  # ... claiming the Run's execution
        ("attacker/owned", "run-3", None),  # another workflow id
    ):
        copy.status.workflow = WorkflowRef(id=workflow_id, run_id=run_id, first_run_id=claimed)
        with pytest.raises(ApplicationError) as refused:
            await as_execution(workflow_id, run_id).run(bridge.mirror_status, copy)
        assert refused.value.type == "CopyRefused" and refused.value.non_retryable, refused.value
    status = (await bridge.kube.get(path(RUN_API, "runs", namespace, "owned")))["status"]
    assert (status["phase"], status["revision"]) == ("Running", 1), "no copy wrote the status"
    events = json.loads(ksquad_cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    refusals = [e for e in events if e["involvedObject"]["name"] == "owned" and e["reason"] == "CopyRefused"]
    assert refusals and all(e["type"] == "Warning" for e in refusals), refusals
    assert any("run-2" in e["message"] for e in refusals), refusals
