"""The Run reconciler: every Run has exactly one workflow, and a deleted Run's workflow ends first.

It lists Runs, then watches from that resourceVersion (bookmarks on; 410 Gone means relist), and hands each
Run to a reconciler, one at a time per Run:
- a new Run gets the finalizer, then its workflow, started idempotently (workflow id `<namespace>/<name>`, the
  Run's uid in the memo and a search attribute): a workflow of this uid that exists, running or closed, is
  never started again, so a bridge restart or a replayed event cannot run a Run twice;
- the annotation `ksquad.io/cancel-requested` becomes the `cancel` signal; `ksquad.io/pause-requested`
  becomes `pause` when set and `resume` when removed; `ksquad.io/input` becomes the `input` signal once the
  Run waits for input, and is then removed (so an answer is given once, to the question it was meant for);
- a Run being deleted has its workflow cancelled (one that takes no cancel signal is sent Temporal's cancel
  request, then terminated); once it ended (or after a bounded wait), the finalizer goes and Kubernetes deletes the Run and, through owner references, its Job and outputs;
- a closed workflow whose final status never reached the Run (an API outage at the end) has it written.
"""

import asyncio
import contextlib
import logging
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

import tracing
from crd_bridge.metrics import RECONCILES
from crd_bridge.resources import (
    CANCEL_ANNOTATION,
    INPUT_ANNOTATION,
    PAUSE_ANNOTATION,
    TRIGGERED_BY_ANNOTATION,
)
from crd_bridge.settings import BridgeSettings
from crd_bridge.status import RunStatusWriter, recorded_chain, run_path
from kube import ApiError, Kube, reflect
from temporal_client.proofs import Signing, signing_as
from temporal_client.runs import EarlierRunStillRunning, RunWorkflows
from temporal_client.seal import Sealer
from workflows.inbox import Sender
from workflows.model import InvalidObject
from workflows.run import RunInput, RunWorkflow
from workflows.signals import RunSignal
from workflows.spec import parse_run_spec, run_workflow_id
from workflows.status import PauseReason, Phase, RunStatus, WorkflowRef

log = logging.getLogger(__name__)

FINALIZER = "ksquad.io/workflow"


def traced(run: dict[str, Any], action: str) -> contextlib.AbstractContextManager[Any]:
    """A span of what the bridge does for the Run (starting its workflow, signalling it), in the Run's trace."""
    meta = run["metadata"]
    triggered_by = meta.get("annotations", {}).get(TRIGGERED_BY_ANNOTATION)
    identity = tracing.run_attributes(meta["namespace"], meta["name"], meta["uid"], triggered_by)
    return tracing.run_span(
        f"reconcile Run: {action}", meta["uid"], {**identity, "ksquad.bridge.action": action}
    )


def for_the_run(run: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
    """Signals sent in this context carry the bridge's proof, for the execution of the Run's workflow the bridge
    recorded (temporal_client.proofs): a copy of one, sent to another execution, does not verify."""
    return signing_as(Signing(Sender.BRIDGE, to_chain=recorded_chain(run.get("status")) or ""))


class RunReconciler:
    def __init__(
        self,
        kube: Kube,
        temporal: Client,
        settings: BridgeSettings,
        status: RunStatusWriter,
        sealer: Sealer | None = None,
    ) -> None:
        self.kube = kube
        self.workflows = RunWorkflows(temporal, settings.worker_task_queue, sealer)
        self.settings = settings
        self.status = status  # writes every status the bridge writes (crd_bridge.status)
        self.started: set[str] = set()  # uids whose workflow exists (a cache; Temporal is the truth)
        self.cancel_sent: set[str] = set()
        self.paused: dict[str, bool] = {}  # uid -> the pause annotation's state last forwarded
        self.input_sent: dict[str, str] = {}  # uid -> the input forwarded whose annotation is not yet removed
        self.pending: dict[str, dict[str, Any]] = {}  # key -> the newest object seen
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.busy: set[str] = set()

    # --- watching -----------------------------------------------------------------------------------------

    def _urls(self) -> list[str]:
        if self.settings.watch_namespaces:
            return [run_path(ns) for ns in self.settings.watch_namespaces]
        return [run_path(None)]  # /apis/ksquad.io/v1alpha1/runs: every namespace

    async def run(self) -> None:
        workers = [asyncio.create_task(self._work()) for _ in range(self.settings.reconcilers)]
        try:
            await asyncio.gather(*(self._watch(url) for url in self._urls()))
        finally:
            for worker in workers:
                worker.cancel()

    async def _watch(self, url: str) -> None:
        def listed(runs: list[dict[str, Any]]) -> None:
            for run in runs:
                self.status.saw(run)
                self.enqueue(run)

        def changed(kind: str, run: dict[str, Any]) -> None:
            self.status.saw(run, deleted=kind == "DELETED")
            self.enqueue(run)

        await reflect(self.kube, url, listed, changed)

    def enqueue(self, run: dict[str, Any]) -> None:
        key = f"{run['metadata']['namespace']}/{run['metadata']['name']}"
        fresh = key not in self.pending
        self.pending[key] = run
        if fresh:
            self.queue.put_nowait(key)

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            if key in self.busy:  # another reconciler has this Run: come back to it
                await asyncio.sleep(0.05)
                self.queue.put_nowait(key)
                continue
            run = self.pending.pop(key, None)
            if run is None:
                continue
            self.busy.add(key)
            try:
                retry = await self.reconcile(run)
                RECONCILES.labels("retry" if retry else "done").inc()
            except Exception:
                log.exception("reconciling %s", key)
                RECONCILES.labels("error").inc()
                retry = True
            finally:
                self.busy.discard(key)
            if retry:
                asyncio.get_running_loop().call_later(1.0, self._requeue, key, run)

    def _requeue(self, key: str, run: dict[str, Any]) -> None:
        if key not in self.pending:
            self.enqueue(run)

    # --- reconciling --------------------------------------------------------------------------------------

    async def reconcile(self, run: dict[str, Any]) -> bool:
        """Bring one Run and its workflow in line; True to try again shortly."""
        meta = run["metadata"]
        if meta.get("deletionTimestamp"):
            return await self.finalize(run)
        if FINALIZER not in meta.get("finalizers", []):
            try:
                run = await self.kube.patch(
                    run_path(meta["namespace"], meta["name"]),
                    {
                        "metadata": {
                            "finalizers": [*meta.get("finalizers", []), FINALIZER],
                            "resourceVersion": meta["resourceVersion"],
                        }
                    },
                )
            except ApiError as err:
                if err.status in (404, 409):
                    return err.status == 409  # changed meanwhile: the watch brings the new version
                raise
            meta = run["metadata"]
        retry = await self.ensure_workflow(run)
        annotation = meta.get("annotations", {}).get(CANCEL_ANNOTATION)
        if annotation is not None and meta["uid"] not in self.cancel_sent:
            handle = self.workflows.handle(meta["namespace"], meta["name"])
            with contextlib.suppress(RPCError), for_the_run(run), traced(run, "cancel"):
                await handle.signal(RunSignal.CANCEL, annotation or f"annotation {CANCEL_ANNOTATION}")
                self.cancel_sent.add(meta["uid"])
        pause = meta.get("annotations", {}).get(PAUSE_ANNOTATION)
        if (pause is not None) != self.paused.get(meta["uid"], False):
            handle = self.workflows.handle(meta["namespace"], meta["name"])
            with (
                contextlib.suppress(RPCError),
                for_the_run(run),
                traced(run, "pause" if pause is not None else "resume"),
            ):
                await (
                    handle.signal(RunSignal.PAUSE, pause or "paused")
                    if pause is not None
                    else handle.signal(RunSignal.RESUME)
                )
                self.paused[meta["uid"]] = pause is not None
        if INPUT_ANNOTATION in meta.get("annotations", {}):
            retry = await self.forward_input(run) or retry
        return retry

    async def forward_input(self, run: dict[str, Any]) -> bool:
        """Send the input annotation's text as the `input` signal while the Run waits for input, then remove the
        annotation (guarded by the version read, so an answer written meanwhile is not lost). An answer written
        before the question is held until it is asked; True to look again shortly."""
        meta, status = run["metadata"], run.get("status") or {}
        uid, text = meta["uid"], meta["annotations"][INPUT_ANNOTATION]
        if Phase(status.get("phase") or "Pending").terminal:
            return False
        if self.input_sent.get(uid) != text:
            if (status.get("phase"), status.get("pauseReason")) != (Phase.PAUSED, PauseReason.INPUT_REQUIRED):
                return False  # the watch brings the status that asks
            try:
                with for_the_run(run), traced(run, "input"):
                    handle = self.workflows.handle(meta["namespace"], meta["name"])
                    await handle.signal(RunSignal.INPUT, text)
            except RPCError as err:
                log.warning("forwarding input to %s/%s: %s", meta["namespace"], meta["name"], err)
                return True
            self.input_sent[uid] = text
            log.info("forwarded the input annotation of %s/%s", meta["namespace"], meta["name"])
        body = {
            "metadata": {"annotations": {INPUT_ANNOTATION: None}, "resourceVersion": meta["resourceVersion"]}
        }
        try:
            await self.kube.patch(run_path(meta["namespace"], meta["name"]), body)
        except ApiError as err:
            if err.status == 404:
                return False
            return err.status == 409  # changed meanwhile: look again at the newest version
        self.input_sent.pop(uid, None)
        return False

    async def ensure_workflow(self, run: dict[str, Any]) -> bool:
        meta = run["metadata"]
        uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
        if uid in self.started:
            return False
        try:
            existing = await self.workflows.find(namespace, name, uid, recorded_chain(run.get("status")))
        except EarlierRunStillRunning:
            return True  # the workflow of an earlier Run of this name is still ending: wait for it
        if existing is not None:
            self.started.add(uid)
            terminal = Phase(run.get("status", {}).get("phase", "Pending")).terminal
            if existing.closed and not existing.replaced and not terminal:
                await self.reconcile_closed(run, existing.handle)
            return False
        try:
            spec = parse_run_spec(run.get("spec"))
        except InvalidObject as err:
            await self.status.refused(run, err)
            self.started.add(uid)
            return False
        triggered_by = meta.get("annotations", {}).get(TRIGGERED_BY_ANNOTATION)
        run_input = RunInput(
            namespace=namespace,
            name=name,
            uid=uid,
            generation=meta.get("generation", 1),
            triggered_by=triggered_by,
            spec=spec,
        )
        with traced(run, "start"):
            try:
                handle = await self.workflows.start(run_input)
            except EarlierRunStillRunning:
                return True  # one was started under the id since `find` looked: look again
            self.started.add(uid)
            log.info("started workflow %s for Run uid %s", handle.id, uid)
            if not (run.get("status") or {}).get("phase"):
                # The execution the bridge started is recorded with it: the bridge acts for no other (envelopes).
                workflow = WorkflowRef(
                    id=handle.id, run_id=handle.result_run_id, first_run_id=handle.first_execution_run_id
                )
                await self.status.taken(run, workflow)
        return False

    async def reconcile_closed(self, run: dict[str, Any], handle: WorkflowHandle[Any, Any]) -> None:
        """The workflow ended but its last status did not reach the Run: write it now."""
        try:
            status: RunStatus = await handle.query(RunWorkflow.state)
        except RPCError as err:
            log.warning("cannot read the final state of %s: %s", handle.id, err)
            return
        status.workflow = status.workflow or WorkflowRef(id=handle.id)
        await self.status.ended(run, status)

    async def finalize(self, run: dict[str, Any]) -> bool:
        """Deletion: cancel the workflow, wait (bounded) for it to end, then let the Run go. A workflow that never
        took the cancel is terminated first (temporal_client.runs.RunWorkflows.cancel_and_wait)."""
        meta = run["metadata"]
        if FINALIZER not in meta.get("finalizers", []):
            return False
        wait = self.settings.cancel_wait_seconds
        chain = recorded_chain(run.get("status"))
        # A workflow that takes no cancel in `wait` is sent Temporal's cancel request, then terminated.
        if not await self.workflows.cancel_and_wait(
            meta["namespace"], meta["name"], meta["uid"], wait, chain=chain, terminate_after=wait
        ):
            workflow_id = run_workflow_id(meta["namespace"], meta["name"])
            log.warning("%s did not end within %.0fs; removing the finalizer anyway", workflow_id, wait)
        try:
            await self.kube.patch(
                run_path(meta["namespace"], meta["name"]),
                {
                    "metadata": {
                        "finalizers": [f for f in meta.get("finalizers", []) if f != FINALIZER],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )
        except ApiError as err:
            if err.status == 409:
                return True
            if err.status != 404:
                raise
        self.started.discard(meta["uid"])
        return False
