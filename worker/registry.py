"""What the ksquad worker runs: the workflows and activities registered on its task queue, and the worker
options every ksquad worker shares."""

import compileall
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import workflows
from activities.entities import EntityActivities
from activities.hello import compose_greeting
from store import Store
from workflows.entities import ConcurrencyGateWorkflow, CredentialThrottleWorkflow
from workflows.hello import HelloWorkflow
from workflows.run import RunWorkflow

RUN_WORKFLOWS: Sequence[type] = (RunWorkflow, CredentialThrottleWorkflow, ConcurrencyGateWorkflow)

# Cancellation reaches a running activity with its next heartbeat's answer, and the SDK throttles heartbeats
# to 0.8 x the heartbeat timeout by default (24 s for the agent activity): cap the throttle so that
# cancelling a run stops its agent within seconds.
HEARTBEAT_THROTTLE = timedelta(seconds=1)

# The sandbox re-imports a workflow's modules for every new workflow run; building the pydantic models again
# costs every run's first workflow task (README, "Benchmarks"). The data modules and pydantic are side-effect free (pure models
# and functions that take `now` as an argument), so they pass through and are imported once per process. The
# workflow modules themselves (run, entities) stay sandboxed, so a non-deterministic call there still fails.
PASSTHROUGH_MODULES = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "workflows.model",
    "workflows.spec",
    "workflows.status",
    "workflows.contract",
    "workflows.run.state",
    "workflows.signals",
    "workflows.activity_types",
    "workflows.entity_types",
    "workflows.policies",
    "workflows.search_attributes",
)
WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
)


# Each cached workflow keeps its sandbox (its own copies of the workflow modules), a few hundred KB: a worker
# holding thousands of paused runs would grow without bound. Past this many, the least recently used is evicted
# and replayed from its history when its timer fires (CPU at resume, instead of memory while paused).
MAX_CACHED_WORKFLOWS = 300


def compile_workflow_modules() -> None:
    """Write the workflow modules' bytecode if it is missing or stale. The sandbox imports a workflow's module
    afresh for every workflow run; without bytecode on disk (PYTHONDONTWRITEBYTECODE, a source-only install)
    each import compiles the workflow modules again, for every run. A read-only install is left as it is."""
    for directory in workflows.__path__:
        compileall.compile_dir(directory, maxlevels=1, quiet=2)  # workflows/ and workflows/run/


def entity_activities(
    client: Client, task_queue: str, store: Store | None = None
) -> list[Callable[..., Any]]:
    entities = EntityActivities(client, task_queue, store)
    return [entities.signal_with_start, entities.find_closed_workflows]


def build_worker(
    client: Client,
    task_queue: str,
    activities: Sequence[Callable[..., Any]] = (),
    workflows: Sequence[type] = RUN_WORKFLOWS,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
    store: Store | None = None,
) -> Worker:
    """A worker for `task_queue`: the Run and entity workflows, the entity activities (keeping credential limits
    in `store` too), and `activities`."""
    compile_workflow_modules()
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[*workflows, HelloWorkflow],
        activities=[*entity_activities(client, task_queue, store), compose_greeting, *activities],
        workflow_runner=WORKFLOW_RUNNER,
        max_cached_workflows=max_cached_workflows,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
