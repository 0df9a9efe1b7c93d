"""What the ksquad worker runs: the workflows and activities registered on its task queue, and the worker
options every ksquad worker shares."""

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.entities import EntityActivities
from activities.hello import compose_greeting
from workflows.entities import ConcurrencyGateWorkflow, CredentialThrottleWorkflow
from workflows.hello import HelloWorkflow
from workflows.run import RunWorkflow

RUN_WORKFLOWS: Sequence[type] = (RunWorkflow, CredentialThrottleWorkflow, ConcurrencyGateWorkflow)

# Cancellation reaches a running activity with its next heartbeat's answer, and the SDK throttles heartbeats
# to 0.8 x the heartbeat timeout by default (24 s for the agent activity): cap the throttle so that
# cancelling a run stops its agent within seconds.
HEARTBEAT_THROTTLE = timedelta(seconds=1)


def entity_activities(client: Client, task_queue: str) -> list[Callable[..., Any]]:
    entities = EntityActivities(client, task_queue)
    return [entities.signal_with_start, entities.find_closed_workflows]


def build_worker(
    client: Client,
    task_queue: str,
    activities: Sequence[Callable[..., Any]] = (),
    workflows: Sequence[type] = RUN_WORKFLOWS,
) -> Worker:
    """A worker for `task_queue`: the Run and entity workflows, the entity activities, and `activities`."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[*workflows, HelloWorkflow],
        activities=[*entity_activities(client, task_queue), compose_greeting, *activities],
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
