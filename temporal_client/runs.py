"""A Run's workflow on Temporal, as both the CRD bridge and the embedded stack (`ksquad dev`) handle it: one
workflow per Run, started at most once, and on deletion cancelled and waited for.

The workflow id is the Run's `<namespace>/<name>`, so a Run deleted and created again under its old name meets
the earlier Run's workflow there: the Run's uid in the memo tells the two apart. Starting uses Temporal's
USE_EXISTING conflict policy, so two starts racing for one Run still make one workflow.
"""

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes as sa
from workflows.run import RunInput, RunWorkflow
from workflows.signals import RunSignal
from workflows.spec import run_workflow_id
from workflows.status import Phase, RunStatus

CLOSED = frozenset(
    {
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    }
)
ENDED_POLL_SECONDS = 0.2  # how often a cancelled workflow is described until it has ended


class EarlierRunStillRunning(RuntimeError):
    """The workflow under the Run's id is an earlier Run's (of the same name) and has not ended: the Run's own
    workflow can start only after it."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"the workflow of an earlier Run {namespace}/{name} is still running")


@dataclass(frozen=True)
class FoundWorkflow:
    """The newest workflow under a Run's workflow id, as Temporal describes it."""

    handle: WorkflowHandle[RunWorkflow, RunStatus]
    status: WorkflowExecutionStatus | None
    uid: str | None  # the uid of the Run it was started for (its memo)

    @property
    def closed(self) -> bool:
        return self.status in CLOSED


class RunWorkflows:
    """The Runs' workflows on one Temporal namespace, started on the worker's `task_queue`."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    def handle(self, namespace: str, name: str) -> WorkflowHandle[RunWorkflow, RunStatus]:
        return self.client.get_workflow_handle_for(RunWorkflow.run, run_workflow_id(namespace, name))

    async def find(self, namespace: str, name: str, uid: str) -> FoundWorkflow | None:
        """The workflow of the Run `uid`, running or ended; None when it has none and one may be started.

        Raises EarlierRunStillRunning while the workflow under the Run's id is an earlier Run's that has not
        ended; once it has, the Run's own workflow starts under the same id."""
        found = await self._describe(namespace, name)
        if found is None:
            return None
        if found.uid == uid:
            return found
        if not found.closed:
            raise EarlierRunStillRunning(namespace, name)
        return None

    async def start(self, run_input: RunInput) -> WorkflowHandle[Any, Any]:
        """Start the Run's workflow, or return the one already running under its id (never a second one).

        The Run's uid goes in the memo: a workflow of an earlier Run of the same name is told apart by it."""
        attributes = [
            SearchAttributePair(sa.PHASE, Phase.PENDING.value),
            SearchAttributePair(sa.NAMESPACE, run_input.namespace),
        ]
        if run_input.triggered_by:
            attributes.append(SearchAttributePair(sa.TRIGGERED_BY, run_input.triggered_by))
        return await self.client.start_workflow(
            "RunWorkflow",
            run_input,
            id=run_input.workflow_id,
            task_queue=self.task_queue,
            result_type=RunStatus,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            memo={"uid": run_input.uid, "generation": run_input.generation},
            search_attributes=TypedSearchAttributes(attributes),
            static_summary=f"Run {run_input.namespace}/{run_input.name}",
        )

    async def cancel_and_wait(
        self, namespace: str, name: str, uid: str | None, within: float, reason: str = "the Run was deleted"
    ) -> bool:
        """Cancel the Run's workflow if it is running (its status says `reason`, not "cancelled through
        Temporal"), then wait up to `within` seconds for it to end.

        With a `uid`, only the workflow of that Run is cancelled: the bridge deleting a Run leaves an earlier
        Run's alone. With None, whichever Run's workflow runs under the id is (the embedded stack).
        False only when the cancelled workflow still runs after `within`. A cancel request that fails is
        waited out all the same (the workflow may have ended meanwhile); other errors from Temporal raise."""
        found = await self._describe(namespace, name)
        if found is None or found.closed or (uid is not None and found.uid != uid):
            return True
        with contextlib.suppress(RPCError):
            # The signal, as the cancel annotation and `ksquad runs cancel` do: the Run's status says why.
            await found.handle.signal(RunSignal.CANCEL, reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            now = await self._describe(namespace, name)
            if now is None or now.closed:
                return True
            await asyncio.sleep(ENDED_POLL_SECONDS)
        return False

    async def _describe(self, namespace: str, name: str) -> FoundWorkflow | None:
        """The newest workflow under the Run's id, or None when there is none."""
        handle = self.handle(namespace, name)
        try:
            description = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        uid = await description.memo_value("uid", default=None)
        return FoundWorkflow(handle, description.status, str(uid) if uid is not None else None)
