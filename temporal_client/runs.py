"""A Run's workflow on Temporal, as both the CRD bridge and the embedded stack (`ksquad dev`) handle it: one
workflow per Run, started at most once with its envelope sealed (workflows.envelope), and on deletion cancelled
and waited for.

The workflow id is the Run's `<namespace>/<name>`, so a Run deleted and created again under its old name meets
the earlier Run's workflow there. Which workflow is the Run's is not taken from anything a client could write
(the memo, a search attribute): it is the execution the bridge recorded on the Run when it started it (its first
run id), and before that record exists, a workflow whose start input is an envelope sealed for this Run's uid.
A workflow under the Run's id whose start input is not sealed at all was started by someone else, and is
terminated, so that it can keep no Run from starting; so is a sealed one (a copy of an earlier Run's start input)
waiting on a task queue no ksquad worker polls. Starting uses Temporal's USE_EXISTING conflict policy, so
two starts racing for one Run still make one workflow.
"""

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

import tracing
from temporal_client.proofs import Signing, signing_as
from temporal_client.seal import Sealer, Unsealed
from workflows import search_attributes as sa
from workflows.inbox import Sender
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
log = logging.getLogger(__name__)
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
    uid: str | None  # the uid of the Run it was started for, when asked and it is a sealed Run's; else None
    chain: str  # its execution: the first run id of its chain
    # The Run's own ended and another workflow was started under its id since (the handle is that one's): the
    # Run's own final state can no longer be read through it.
    replaced: bool = False
    phase: str | None = None  # its KsquadPhase search attribute, as last upserted
    task_queue: str = ""

    @property
    def closed(self) -> bool:
        return self.status in CLOSED


class RunWorkflows:
    """The Runs' workflows on one Temporal namespace, started on the worker's `task_queue` with envelopes sealed
    by `sealer` (None: unsealed, which the bridge and the worker refuse; tests of this class alone)."""

    def __init__(self, client: Client, task_queue: str, sealer: Sealer | None = None) -> None:
        self.client = client
        self.task_queue = task_queue
        self.sealer = sealer

    def handle(self, namespace: str, name: str) -> WorkflowHandle[RunWorkflow, RunStatus]:
        return self.client.get_workflow_handle_for(RunWorkflow.run, run_workflow_id(namespace, name))

    async def find(
        self, namespace: str, name: str, uid: str, chain: str | None = None
    ) -> FoundWorkflow | None:
        """The workflow of the Run `uid` (whose execution is `chain` once recorded), running or ended; None when
        it has none and one may be started.

        Raises EarlierRunStillRunning while the workflow under the Run's id is another's that has not ended; once
        it has, the Run's own workflow starts under the same id. One that no bridge started (its start input is
        not sealed) is terminated first."""
        found = await self._describe(namespace, name, with_uid=chain is None)
        if found is None:
            return None
        if (chain is not None and found.chain == chain) or (chain is None and found.uid == uid):
            return found
        if chain is not None:  # the Run's own ended, and something was started under its id since
            return dataclasses.replace(
                found, status=WorkflowExecutionStatus.COMPLETED, chain=chain, replaced=True
            )
        if not found.closed:
            if self.sealer is not None and found.uid is None:
                why = "its start input is no envelope the bridge sealed"
            elif self.sealer is not None and found.task_queue != self.task_queue:
                # A sealed envelope (an earlier Run's, copied) where no ksquad worker will ever run it: waited
                # out, it would keep this Run from starting forever.
                why = f"it waits on task queue {found.task_queue}, which no ksquad worker polls"
            else:
                raise EarlierRunStillRunning(namespace, name)
            await found.handle.terminate(
                reason=f"not ksquad's to run: {why}; Run {namespace}/{name} starts in its place"
            )
            log.warning("terminated workflow %s: %s", found.handle.id, why)
            return None
        return None

    async def start(self, run_input: RunInput) -> WorkflowHandle[Any, Any]:
        """Start the Run's workflow, or return the Run's own if it is already running (never a second one); the
        handle of a new one names its execution (`first_execution_run_id`), which the caller records on the Run.
        Raises EarlierRunStillRunning when another workflow runs under the id (started since `find` looked).

        The Run's uid goes in the memo (for people reading the Temporal UI; ksquad reads it from the sealed
        envelope)."""
        if self.sealer is not None:
            run_input = self.sealer.seal_envelope(run_input)
        attributes = [
            SearchAttributePair(sa.PHASE, Phase.PENDING.value),
            SearchAttributePair(sa.NAMESPACE, run_input.namespace),
        ]
        if run_input.triggered_by:
            attributes.append(SearchAttributePair(sa.TRIGGERED_BY, run_input.triggered_by))
        # The Run's trace (tracing: its id derived from the uid), carried into the workflow's headers.
        identity = tracing.run_attributes(
            run_input.namespace, run_input.name, run_input.uid, run_input.triggered_by
        )
        with tracing.run_span("start Run workflow", run_input.uid, identity):
            return await self._start(run_input, attributes)

    async def _start(
        self, run_input: RunInput, attributes: list[SearchAttributePair[str]]
    ) -> WorkflowHandle[Any, Any]:
        try:
            return await self.client.start_workflow(
                "RunWorkflow",
                run_input,
                id=run_input.workflow_id,
                task_queue=self.task_queue,
                result_type=RunStatus,
                # Not USE_EXISTING: the workflow running under the id might be anyone's, and its run id must never
                # be recorded as this Run's execution. Two starts racing: the second finds the first's.
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                memo={"uid": run_input.uid, "generation": run_input.generation},
                search_attributes=TypedSearchAttributes(attributes),
                static_summary=f"Run {run_input.namespace}/{run_input.name}",
            )
        except WorkflowAlreadyStartedError as err:
            found = await self._describe(run_input.namespace, run_input.name, with_uid=True)
            if found is not None and found.uid == run_input.uid:  # this Run's own, started already
                return self.client.get_workflow_handle_for(
                    RunWorkflow.run, found.handle.id, run_id=err.run_id, first_execution_run_id=found.chain
                )
            raise EarlierRunStillRunning(run_input.namespace, run_input.name) from None

    async def cancel_and_wait(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        within: float,
        reason: str = "the Run was deleted",
        chain: str | None = None,
        terminate_after: float | None = None,
    ) -> bool:
        """Cancel the Run's workflow if it is running (its status says `reason`, not "cancelled through
        Temporal"), then wait up to `within` seconds for it to end.

        With a `uid`, only the workflow of that Run is cancelled: the bridge deleting a Run leaves an earlier
        Run's alone. With None, whichever Run's workflow runs under the id is (the embedded stack).
        False only when the cancelled workflow still runs after `within`. A cancel request that fails is
        waited out all the same (the workflow may have ended meanwhile); other errors from Temporal raise.

        With `terminate_after`, a cancel lands whatever became of the signal: a workflow that has not taken it by
        then (not Cancelling: its signals flooded, or no worker takes its tasks) is sent Temporal's own cancel
        request, and terminated if it still runs `terminate_after` seconds later. One that took it and is still
        tearing down (an agent slow to stop, a sandbox being confirmed gone) is not cut short."""
        found = await self._describe(namespace, name, with_uid=uid is not None and chain is None)
        if found is None or found.closed:
            return True
        if uid is not None and not (found.chain == chain if chain is not None else found.uid == uid):
            return True
        with contextlib.suppress(RPCError), signing_as(Signing(Sender.BRIDGE, to_chain=found.chain)):
            # The signal, as the cancel annotation and `ksquad runs cancel` do: the Run's status says why.
            await found.handle.signal(RunSignal.CANCEL, reason)
        if await self._ended_within(namespace, name, within):
            return True
        if terminate_after is None:
            return False
        now = await self._describe(namespace, name)
        if now is None or now.closed:
            return True
        if now.chain != found.chain or now.phase == Phase.CANCELLING.value:
            return False  # another Run's now; or this one took the cancel and tears down
        # Its chain, whichever run of it is current: never a workflow started under the id since.
        own = self.client.get_workflow_handle(found.handle.id, first_execution_run_id=found.chain)
        log.warning(
            "workflow %s took no cancel signal in %.0fs (phase %s): asking Temporal to cancel it",
            own.id,
            within,
            now.phase,
        )
        with contextlib.suppress(RPCError):
            await own.cancel()
        if await self._ended_within(namespace, name, terminate_after):
            return True
        log.warning(
            "workflow %s did not end %.0fs after Temporal's cancel request: terminated",
            own.id,
            terminate_after,
        )
        with contextlib.suppress(RPCError):
            await own.terminate(
                reason=f"{reason}: it took neither the cancel signal in {within:.0f}s nor Temporal's cancel request in "
                f"{terminate_after:.0f}s (its signals flooded, or no worker takes its tasks)"
            )
        return await self._ended_within(namespace, name, ENDED_POLL_SECONDS * 25)

    async def _ended_within(self, namespace: str, name: str, seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            now = await self._describe(namespace, name)
            if now is None or now.closed:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(ENDED_POLL_SECONDS)

    async def _describe(self, namespace: str, name: str, with_uid: bool = False) -> FoundWorkflow | None:
        """The newest workflow under the Run's id, or None when there is none; `with_uid`: and whose sealed Run
        it is (one read of its history)."""
        handle = self.handle(namespace, name)
        try:
            description = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        info = description.raw_description.workflow_execution_info
        chain = info.first_run_id or description.run_id
        uid = await self._sealed_uid(handle, description) if with_uid else None
        phase = description.typed_search_attributes.get(sa.PHASE)
        return FoundWorkflow(
            handle, description.status, uid, chain, phase=phase, task_queue=description.task_queue
        )

    async def _sealed_uid(
        self, handle: WorkflowHandle[RunWorkflow, RunStatus], description: WorkflowExecutionDescription
    ) -> str | None:
        """The uid of the Run whose sealed envelope the workflow was started with; None for any other start.
        Without a sealer, the memo's (tests of this class alone)."""
        if self.sealer is None:
            uid = await description.memo_value("uid", default=None)
            return str(uid) if uid is not None else None
        if description.workflow_type != "RunWorkflow":
            return None
        try:
            async for event in handle.fetch_history_events():
                started = event.workflow_execution_started_event_attributes
                (envelope,) = await self.client.data_converter.decode(started.input.payloads, [RunInput])
                self.sealer.check_envelope(envelope, handle.id)
                return str(envelope.uid)
        except (Unsealed, ValueError, TypeError):
            return None
        return None
