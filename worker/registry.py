"""What the ksquad worker runs: the workflows and activities registered on its task queue, and the worker
options every ksquad worker shares."""

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.entities import EntityActivities
from activities.hello import compose_greeting
from store import Store
from temporal_client.chains import Chains
from temporal_client.connection import with_signing
from temporal_client.seal import Sealer
from worker.seals import SealCheck
from workflows.entities import (
    ConcurrencyGateWorkflow,
    CredentialAnnouncerWorkflow,
    CredentialThrottleWorkflow,
)
from workflows.hello import HelloWorkflow
from workflows.run import RunWorkflow

RUN_WORKFLOWS: Sequence[type] = (
    RunWorkflow,
    CredentialThrottleWorkflow,
    CredentialAnnouncerWorkflow,
    ConcurrencyGateWorkflow,
)

# Cancellation reaches a running activity with its next heartbeat's answer, and the SDK throttles heartbeats
# to 0.8 x the heartbeat timeout by default (24 s for the agent activity): cap the throttle so that
# cancelling a run stops its agent within seconds.
HEARTBEAT_THROTTLE = timedelta(seconds=1)

# Workflows run without Temporal's sandbox. With every module the workflows use passed through (re-importing them
# for each new run cost ~75 ms and 380 KB of a cached run), the sandbox restricted nothing at run time, yet it
# still cost a third of the worker's workflow CPU: each activation entered its import hooks, and each payload the
# codec encrypted or decrypted asked the sandbox for its serialization context by compiling and running a code
# string in it. Sandboxed as Temporal advises (only pydantic passed through), the core is restricted and replays
# unchanged, but re-imported for each Run: 826 ms of workflow CPU a Run against 14, 77% of throughput
# (bench.workflow_sandbox). tests/workflows/test_determinism.py is the guard instead: it fails on any import, clock
# (even uncalled), I/O, set walk or module-level state in workflows/ that a replay could not repeat, and the
# replays of recorded histories (test_replay.py) catch a change of commands.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()


# Each cached workflow keeps its state and its asyncio tasks: a worker
# holding thousands of paused runs would grow without bound. Past this many, the least recently used is evicted
# and replayed from its history when its timer fires (CPU at resume, instead of memory while paused).
MAX_CACHED_WORKFLOWS = 300


def entity_activities(
    client: Client, task_queue: str, store: Store | None = None
) -> list[Callable[..., Any]]:
    entities = EntityActivities(client, task_queue, store)
    return [entities.signal_with_start, entities.find_closed_workflows, entities.announce_credential_limit]


def build_worker(
    client: Client,
    task_queue: str,
    activities: Sequence[Callable[..., Any]] = (),
    workflows: Sequence[type] = RUN_WORKFLOWS,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
    store: Store | None = None,
    sealer: Sealer | None = None,
) -> Worker:
    """A worker for `task_queue`: the Run and entity workflows, the entity activities (keeping credential limits
    in `store` too), and `activities`. With `sealer`, it makes no sandbox and calls no agent that the bridge did
    not resolve (worker.seals): every production worker has one; tests of single activities may go without."""
    # The entity activities signal as the worker, for the run they run for (temporal_client.proofs).
    signer = with_signing(client, sealer) if sealer else client
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[*workflows, HelloWorkflow],
        activities=[*entity_activities(signer, task_queue, store), compose_greeting, *activities],
        workflow_runner=WORKFLOW_RUNNER,
        max_cached_workflows=max_cached_workflows,
        interceptors=[SealCheck(sealer, Chains(client))] if sealer else [],
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
