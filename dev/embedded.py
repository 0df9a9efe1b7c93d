"""The embedded default's stand-in for the API server and the CRD bridge: manifests applied with
`ksquad run -f` are kept in SQLite (store.objects), each Run gets its workflow exactly as the
bridge would start it, and the `ksquad-bridge` task queue is served from here:

- `resolve_references` resolves with the bridge's own rules (crd_bridge.resolve) over the applied objects;
  the ModelEndpoint named `local` exists in every namespace unless one is applied under that name: the
  model of this machine (`OPENAI_BASE_URL`, else the scripted model `ksquad dev` starts);
- `mirror_status` writes the status into the store (revision- and uid-guarded) and appends each phase change
  to the run's event log, which `ksquad runs watch` streams.
"""

import contextlib
import getpass
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from crd_bridge.envelopes import Execution, check_chain, check_envelope, counted, execution_chain, refusal
from crd_bridge.events import phase_records
from crd_bridge.resolve import (
    ALLOWED_HOSTS_ANNOTATION,
    CREDENTIAL_LABEL,
    KINDS,
    not_this_run,
    resolve,
    stored_spec,
)
from crd_bridge.status import recorded_chain, status_body
from store import StoreError
from store.objects import Applied, ObjectStore, StoredObject
from temporal_client.chains import Chains
from temporal_client.proofs import Signing, signing_as
from temporal_client.runs import RunWorkflows
from temporal_client.seal import Copied, Sealer, Unsealed
from workflows.activity_types import Activity, ResolveRequest, RunRef
from workflows.contract import Resolution
from workflows.inbox import Sender
from workflows.model import InvalidObject, field_problems
from workflows.run import RunInput
from workflows.signals import RunSignal
from workflows.spec import API_VERSION, ObjectMeta, parse_run_manifest, run_workflow_id
from workflows.status import Phase, StatusSnapshot, not_waiting_for_input

log = logging.getLogger(__name__)

LOCAL_MODEL_ENDPOINT = "local"
LOCAL_CREDENTIAL_SECRET = "local-model"  # its key `apiKey` is OPENAI_API_KEY, handed to local sandboxes
ALL_KINDS = ("Run", *KINDS)


class UnknownRun(LookupError):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f'run "{namespace}/{name}" not found')


class RunRefuses(Exception):
    """A signal the Run cannot take in its state (it has ended; it asks no question): nothing was sent."""


@dataclass(frozen=True)
class Manifest:
    """One validated document of an applied file."""

    kind: str
    namespace: str
    name: str
    spec: dict[str, Any]


def validate_documents(docs: Iterable[Any]) -> list[Manifest]:
    """Every document checked before any is applied; InvalidObject names the document and each bad field."""
    manifests, problems = [], []
    for index, doc in enumerate(docs, 1):
        if doc is None:
            continue
        where = f"document {index}"
        if not isinstance(doc, dict):
            problems.append(f"{where}: a mapping with apiVersion, kind, metadata and spec is expected")
            continue
        kind = doc.get("kind")
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
        if name:
            where = f"{where} ({kind} {name})"
        if doc.get("apiVersion") != API_VERSION:
            problems.append(f"{where}: apiVersion: {API_VERSION} expected (got {doc.get('apiVersion')!r})")
            continue
        if kind not in ALL_KINDS:
            problems.append(f"{where}: kind: one of {', '.join(ALL_KINDS)} expected (got {kind!r})")
            continue
        try:
            if kind == "Run":
                run = parse_run_manifest(doc)
                meta: ObjectMeta
                meta, spec = run.metadata, run.spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
            else:
                meta = ObjectMeta.model_validate(doc.get("metadata") or {})
                spec = (
                    KINDS[kind]
                    .model_validate(doc.get("spec") or {})
                    .model_dump(mode="json", by_alias=True, exclude_unset=True)
                )
        except InvalidObject as err:
            problems += [f"{where}: {p}" for p in err.problems]
            continue
        except ValidationError as err:
            prefix = (
                "metadata"
                if any(e["loc"] and e["loc"][0] in ("name", "namespace") for e in err.errors())
                else "spec"
            )
            problems += [f"{where}: {p}" for p in field_problems(err, prefix)]
            continue
        manifests.append(Manifest(kind, meta.namespace, meta.name, spec))
    if problems:
        raise InvalidObject("manifest", problems)
    if not manifests:
        raise InvalidObject("manifest", ["no documents to apply"])
    return manifests


class EmbeddedBridge:
    """The activities of the `ksquad-bridge` task queue, over the embedded object store."""

    def __init__(
        self,
        objects: ObjectStore,
        local_model_url: str,
        local_model: str | None = None,
        sealer: Sealer | None = None,
        chains: Chains | None = None,
    ) -> None:
        self.objects = objects
        self.sealer = sealer
        self.chains = chains
        self.local_endpoint: dict[str, Any] = {
            "url": local_model_url,
            "credentialSecretRef": {"name": LOCAL_CREDENTIAL_SECRET, "key": "apiKey"},
        }
        if local_model:
            self.local_endpoint["model"] = local_model

    @activity.defn(name=Activity.RESOLVE_REFERENCES)
    async def resolve_references(self, req: ResolveRequest) -> Resolution:
        """As the cluster bridge does (crd_bridge.envelopes): the Run as stored (by uid), for the execution of its
        workflow recorded on it, resolved and sealed for the worker."""
        envelope, execution = req.envelope, Execution.current()
        namespace, name, uid = envelope.namespace, envelope.name, envelope.uid
        try:
            check_envelope(self.sealer, envelope, execution)
            run = await self._run(namespace, name)
            if run is None or run.uid != uid:
                return not_this_run(namespace, name, uid)
            chain = await self._chain(run, execution)
        except Unsealed as err:
            await self._refused(Activity.RESOLVE_REFERENCES, envelope.run_ref, err, execution)
            raise refusal(err) from None
        resolution = await self._resolve(run)
        return self.sealer.seal_warrant(envelope, chain, resolution) if self.sealer else resolution

    async def _run(self, namespace: str, name: str) -> StoredObject | None:
        try:
            return await self.objects.get("Run", namespace, name)
        except StoreError as err:
            raise ApplicationError(str(err), type="StoreUnavailable") from None

    async def _chain(self, run: StoredObject, execution: Execution) -> str:
        """The execution asking must be the one recorded on the Run (the first to ask records it, when none is)."""
        recorded = recorded_chain(run.status)
        chain = await execution_chain(self.chains, execution, recorded)
        if recorded is None:  # recorded once (most often at the start already): no write on every resolve
            try:
                recorded = await self.objects.record_run_chain(run.namespace, run.name, run.uid, chain)
            except StoreError as err:
                raise ApplicationError(str(err), type="StoreUnavailable") from None
        check_chain(f"{run.namespace}/{run.name}", recorded, chain, execution)
        return chain

    async def _refused(self, activity_name: str, run: RunRef, err: Unsealed, execution: Execution) -> None:
        counted(activity_name, err, execution)
        if isinstance(
            err, Copied
        ):  # a sealed envelope: the Run it names is real, and its event stream says so
            with contextlib.suppress(StoreError):
                await self.objects.store.append_notice(
                    run.uid, f"{run.namespace}/{run.name}", "refusal", str(err)
                )

    async def _resolve(self, run: StoredObject) -> Resolution:
        namespace = run.namespace
        spec = stored_spec(run.spec)
        if isinstance(spec, Resolution):
            return spec

        async def lookup(kind: str, name: str) -> dict[str, Any] | None:
            obj = await self.objects.get(kind, namespace, name)
            if obj is not None:
                return obj.spec
            if kind == "ModelEndpoint" and name == LOCAL_MODEL_ENDPOINT:
                return self.local_endpoint
            # The only credential here: the local key.
            if kind == "Secret" and name == LOCAL_CREDENTIAL_SECRET:
                # It goes to the local model only (OPENAI_BASE_URL, or the scripted model).
                return {
                    "labels": {CREDENTIAL_LABEL: "true"},
                    "annotations": {ALLOWED_HOSTS_ANNOTATION: urlsplit(self.local_endpoint["url"]).netloc},
                }
            return None

        try:
            return await resolve(namespace, spec, lookup)
        except StoreError as err:
            raise ApplicationError(str(err), type="StoreUnavailable") from None

    @activity.defn(name=Activity.MIRROR_STATUS)
    async def mirror_status(self, snapshot: StatusSnapshot) -> None:
        """The status into the store, from the Run's own execution only (as the cluster bridge's)."""
        execution = Execution.current()
        run_ref = RunRef(namespace=snapshot.namespace, name=snapshot.name, uid=snapshot.uid)
        claimed = snapshot.status.workflow.first_run_id if snapshot.status.workflow else None
        try:
            if execution.workflow_id != run_workflow_id(snapshot.namespace, snapshot.name):
                raise Copied(
                    f"workflow {execution.workflow_id} sent the status of Run {snapshot.namespace}/{snapshot.name}"
                )
            chain = await execution_chain(self.chains, execution, claimed)
            if claimed is not None and claimed != chain:
                raise Copied(
                    f"workflow {execution.workflow_id} run {execution.run_id} claimed execution {claimed}"
                )
            # Written only for the execution recorded on the Run (checked in the write itself); one that is not
            # written is looked at again to say why, when the reason is a copy.
            written = await self.objects.write_run_status(
                snapshot.namespace,
                snapshot.name,
                snapshot.uid,
                snapshot.status.revision,
                status_body(snapshot),
                phase_records(snapshot),
                chain=chain,
            )
            if not written:
                run = await self._run(snapshot.namespace, snapshot.name)
                if run is not None and run.uid == snapshot.uid:
                    check_chain(f"{run.namespace}/{run.name}", recorded_chain(run.status), chain, execution)
        except Copied as err:
            await self._refused(Activity.MIRROR_STATUS, run_ref, err, execution)
            raise refusal(err) from None
        except StoreError as err:
            raise ApplicationError(str(err), type="StoreUnavailable") from None

    def all(self) -> list[Any]:
        return [self.resolve_references, self.mirror_status]


class EmbeddedRuns:
    """What kubectl and the bridge do on a cluster, for the runs of this machine."""

    def __init__(
        self, objects: ObjectStore, temporal: Client, worker_task_queue: str, sealer: Sealer | None = None
    ) -> None:
        self.objects = objects
        self.workflows = RunWorkflows(temporal, worker_task_queue, sealer)
        self.user = getpass.getuser()

    async def apply(self, docs: Iterable[Any]) -> list[dict[str, str]]:
        """Store the documents (all or none are valid), then start a workflow for each new Run."""
        results = []
        for m in validate_documents(docs):
            obj, action = await self.objects.apply(m.kind, m.namespace, m.name, m.spec)
            shown: str = action
            if m.kind == "Run":
                shown = await self._started(obj, action)
            elif action != "unchanged":
                await self._references_changed(m.namespace)
            results.append({"kind": m.kind, "namespace": m.namespace, "name": m.name, "action": shown})
        return results

    async def _started(self, run: StoredObject, action: Applied) -> str:
        if action == "configured":
            # A Run's work is fixed when it starts, as with the bridge: a changed spec is stored, not re-run.
            return "configured (the running workflow keeps the spec it started with; delete the Run to re-run it)"
        await self.ensure_workflow(run)
        return action

    async def ensure_workflow(self, run: StoredObject) -> None:
        """Start the Run's workflow unless one of this Run (uid) exists; a second never starts. Raises
        EarlierRunStillRunning while an earlier Run of this name has its workflow still running."""
        if (
            await self.workflows.find(run.namespace, run.name, run.uid, recorded_chain(run.status))
            is not None
        ):
            return
        spec = parse_run_manifest(run.manifest()).spec
        run_input = RunInput(
            namespace=run.namespace,
            name=run.name,
            uid=run.uid,
            generation=run.generation,
            triggered_by=self.user,
            spec=spec,
        )
        handle = await self.workflows.start(run_input)
        if (
            handle.first_execution_run_id
        ):  # the execution this Run is, recorded at once (crd_bridge.envelopes)
            await self.objects.record_run_chain(
                run.namespace, run.name, run.uid, handle.first_execution_run_id
            )
        log.info("started the workflow of Run %s/%s", run.namespace, run.name)

    async def resume_unfinished(self) -> int:
        """At start: every Run not yet finished has its workflow (a crash between storing and starting one
        leaves none). Workflows that exist go on by themselves once the worker polls."""
        count = 0
        for run in await self.objects.of_kind("Run"):
            if not Phase((run.status or {}).get("phase", "Pending")).terminal:
                await self.ensure_workflow(run)
                count += 1
        return count

    async def _references_changed(self, namespace: str) -> None:
        """An Agent, ModelEndpoint... changed: runs waiting for references look again now."""
        for run in await self.objects.of_kind("Run", namespace):
            if not Phase((run.status or {}).get("phase", "Pending")).terminal:
                with contextlib.suppress(RPCError):
                    handle = self.workflows.handle(run.namespace, run.name)
                    await handle.signal(RunSignal.REFERENCES_UPDATED)

    async def get(self, namespace: str, name: str) -> StoredObject:
        run = await self.objects.get("Run", namespace, name)
        if run is None:
            raise UnknownRun(namespace, name)
        return run

    async def signal(self, namespace: str, name: str, signal: RunSignal, *args: Any) -> StoredObject:
        run = await self.get(namespace, name)
        phase = Phase((run.status or {}).get("phase") or Phase.PENDING)
        if phase.terminal:
            raise RunRefuses(f"run {namespace}/{name} has ended ({phase}): it takes no {signal}")
        if signal == RunSignal.INPUT and (why := not_waiting_for_input(run.status)):
            raise RunRefuses(f"run {namespace}/{name} is not waiting for input: {why}")
        try:
            # Proven as the bridge's, for this Run's own execution (temporal_client.proofs).
            with signing_as(Signing(Sender.BRIDGE, to_chain=recorded_chain(run.status) or "")):
                await self.workflows.handle(namespace, name).signal(signal, *args)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:  # ended since its status was read
                raise
            raise RunRefuses(f"run {namespace}/{name} has ended: it takes no {signal}") from None
        return run

    async def delete(self, namespace: str, name: str, wait_seconds: float = 30.0) -> StoredObject:
        """Cancel the Run's workflow, wait (bounded) for it to end, then forget the Run."""
        run = await self.get(namespace, name)
        # Whichever Run's workflow runs under the name is cancelled (the store holds one Run per name, so an
        # earlier Run's is one a deletion already gave up waiting for). Temporal unreachable: the Run is
        # forgotten all the same.
        with contextlib.suppress(RPCError):
            await self.workflows.cancel_and_wait(
                namespace, name, None, wait_seconds, terminate_after=wait_seconds
            )
        await self.objects.delete("Run", namespace, name, run.uid)
        return run
