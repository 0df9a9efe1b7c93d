"""What the ksquad worker runs: the workflows and activities registered on its task queue."""

from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.hello import compose_greeting
from workflows.hello import HelloWorkflow

WORKFLOWS: Sequence[type] = (HelloWorkflow,)
ACTIVITIES: Sequence[Callable[..., Any]] = (compose_greeting,)


def build_worker(client: Client, task_queue: str) -> Worker:
    return Worker(client, task_queue=task_queue, workflows=WORKFLOWS, activities=ACTIVITIES)
