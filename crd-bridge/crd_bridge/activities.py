"""The bridge's activities, on task queue `ksquad-bridge`: they are the only code that touches ksquad.io
objects on behalf of a workflow.

- `resolve_references`: the Run's references, read from the API server in the Run's namespace.
- `mirror_status`: the workflow's status onto the Run's status subresource, from the execution the bridge
  started and no other; crd_bridge.status writes it (guarded by revision and resourceVersion), as it writes
  every status the bridge writes.
"""

import contextlib
import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crd_bridge.envelopes import Execution, check_chain, check_envelope, counted, execution_chain, refusal
from crd_bridge.events import RUN_API
from crd_bridge.resolve import ANYTHING, KINDS, AllowLists, not_this_run, resolve, stored_spec
from crd_bridge.resources import PLURALS, TRIGGERED_BY_ANNOTATION, TRIGGERED_BY_GROUPS_ANNOTATION
from crd_bridge.status import RunStatusWriter, recorded_chain, run_path
from kube import ApiError, Kube, Unreachable, path
from store import StoreError
from temporal_client.chains import Chains
from temporal_client.seal import Copied, Sealer, Unsealed
from workflows.activity_types import Activity, ResolveRequest, RunRef
from workflows.contract import Resolution
from workflows.spec import run_workflow_id
from workflows.status import StatusSnapshot

log = logging.getLogger(__name__)


class BridgeActivities:
    def __init__(
        self,
        kube: Kube,
        status: RunStatusWriter,
        namespace_limit: int | None = None,
        allow: AllowLists = ANYTHING,
        sealer: Sealer | None = None,
        chains: Chains | None = None,
    ) -> None:
        self.kube = kube
        # Writes every status the bridge writes (crd_bridge.status), shared with the reconciler.
        self.status = status
        # Which execution each activity runs for, as the Temporal server says (None: tests of the activities alone).
        self.chains = chains
        # Seals every resolution for the worker (temporal_client.seal); None: unsealed, which a worker refuses.
        self.sealer = sealer
        self.namespace_limit = namespace_limit
        self.allow = allow

    @activity.defn(name=Activity.RESOLVE_REFERENCES)
    async def resolve_references(self, req: ResolveRequest) -> Resolution:
        """The Run's references, resolved from the Run as the API server stores it, for the execution of its
        workflow the bridge started, and sealed for it (the warrant, crd_bridge.envelopes): a workflow started with
        a copy of the Run's envelope gets none."""
        envelope, execution = req.envelope, Execution.current()
        namespace, name, uid = envelope.namespace, envelope.name, envelope.uid
        try:
            check_envelope(self.sealer, envelope, execution)
        except Unsealed as err:
            await self.refused(Activity.RESOLVE_REFERENCES, envelope.run_ref, err, execution)
            raise refusal(err) from None
        run = await self._read_run(namespace, name)
        if run is None or run["metadata"].get("uid") != uid:
            return not_this_run(namespace, name, uid)
        try:
            chain = await self._chain(run, execution)
        except Copied as err:
            await self.refused(Activity.RESOLVE_REFERENCES, envelope.run_ref, err, execution)
            raise refusal(err) from None
        resolution = await self._resolve(namespace, run)
        if resolution.outcome == "resolved" and envelope.spec.work_item_ref:
            resolution = await self._may_claim(run, envelope.spec.work_item_ref) or resolution
        return self.sealer.seal_warrant(envelope, chain, resolution) if self.sealer else resolution

    async def _may_claim(self, run: dict[str, Any], item: str) -> Resolution | None:
        """A Run claims and writes its work item only if its creator may `update` it (RBAC on workitems.ksquad.io,
        as ksquad-api asks for a person's own writes): a LocalSubjectAccessReview as the creator stamped at
        admission, with their groups. None: they may; else the Run is invalid, naming the item and who."""
        meta = run["metadata"]
        annotations = meta.get("annotations") or {}
        user = annotations.get(TRIGGERED_BY_ANNOTATION)
        namespace = meta["namespace"]
        if not user:
            return Resolution(
                outcome="invalid",
                error=(
                    f"the Run names work item {namespace}/{item} but not who created it (annotation "
                    f"{TRIGGERED_BY_ANNOTATION}, stamped at admission): a Run claims only an item its creator may update"
                ),
            )
        groups = [g for g in annotations.get(TRIGGERED_BY_GROUPS_ANNOTATION, "").split(",") if g]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "LocalSubjectAccessReview",
            "metadata": {"namespace": namespace},
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "update",
                    "group": "ksquad.io",
                    "resource": "workitems",
                    "name": item,
                },
            },
        }
        try:
            answer = await self.kube.create(
                path("authorization.k8s.io/v1", "localsubjectaccessreviews", namespace), review
            )
        except ApiError as err:
            raise ApplicationError(
                f"asking whether {user} may update work item {item}: {err}", type="KubernetesError"
            ) from None
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None
        if (answer.get("status") or {}).get("allowed"):
            return None
        return Resolution(
            outcome="invalid",
            error=(
                f"{user}, who created the Run, may not update work item {namespace}/{item} (RBAC: update "
                "workitems.ksquad.io, which the `edit` and `admin` roles grant): a Run claims only an item its "
                "creator may update"
            ),
        )

    async def _read_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.kube.get(run_path(namespace, name))
            return found
        except ApiError as err:
            if err.status != 404:
                raise ApplicationError(
                    f"reading Run {namespace}/{name}: {err}", type="KubernetesError"
                ) from None
            return None
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    async def _chain(self, run: dict[str, Any], execution: Execution) -> str:
        """The execution asking, which must be the one recorded on the Run; the first to ask records it when none
        is recorded yet (the bridge records the one it starts at once: the first to ask is that one)."""
        meta = run["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        for _ in range(10):
            recorded = recorded_chain(run.get("status"))
            chain = await execution_chain(self.chains, execution, recorded)
            check_chain(key, recorded, chain, execution)
            if recorded is not None:
                return chain
            if await self.status.record_execution(run, execution.workflow_id, chain):
                return chain
            fresh = await self._read_run(meta["namespace"], meta["name"])
            if fresh is None or fresh["metadata"]["uid"] != meta["uid"]:
                raise ApplicationError(f"Run {key} is gone", type="RunGone", non_retryable=True)
            run, meta = fresh, fresh["metadata"]
        raise ApplicationError(f"recording {key}'s execution: too many conflicts", type="Conflict")

    async def refused(self, activity_name: str, run: RunRef, err: Unsealed, execution: Execution) -> None:
        """Counted and logged; a copy (a sealed envelope: the Run it names is real) is also an Event on the Run."""
        counted(activity_name, err, execution)
        if not isinstance(err, Copied):
            return
        await self.status.events.refusal(
            run.namespace, run.name, run.uid, execution.workflow_id, execution.run_id, err
        )
        if self.status.store is not None:
            with contextlib.suppress(StoreError):
                await self.status.store.append_notice(
                    run.uid, f"{run.namespace}/{run.name}", "refusal", str(err)
                )

    async def _resolve(self, namespace: str, run: dict[str, Any]) -> Resolution:
        spec = stored_spec(run.get("spec"))
        if isinstance(spec, Resolution):
            return spec

        async def lookup(kind: str, name: str) -> dict[str, Any] | None:
            if kind == "Secret":  # its labels and annotations, by a metadata-only list: never its data
                found = await self.kube.list(
                    path("v1", "secrets", namespace), fields=f"metadata.name={name}", metadata_only=True
                )
                items = found.get("items") or []
                if not items:
                    return None
                meta = items[0]["metadata"]
                return {"labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}}
            assert kind in KINDS
            try:
                obj = await self.kube.get(path(RUN_API, PLURALS[kind], namespace, name))
            except ApiError as err:
                if err.status == 404:
                    return None
                raise ApplicationError(
                    f"reading {kind} {namespace}/{name}: {err}", type="KubernetesError"
                ) from None
            spec: dict[str, Any] = obj.get("spec") or {}
            return spec

        try:
            return await resolve(namespace, spec, lookup, self.namespace_limit, self.allow)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    @activity.defn(name=Activity.MIRROR_STATUS)
    async def mirror_status(self, snapshot: StatusSnapshot) -> None:
        """The workflow's status onto its Run, from the execution the bridge started for it and no other: a copy
        of the Run's workflow (under another id, or the same id once the Run's workflow closed) writes nothing."""
        execution = Execution.current()
        run = RunRef(namespace=snapshot.namespace, name=snapshot.name, uid=snapshot.uid)
        claimed = snapshot.status.workflow.first_run_id if snapshot.status.workflow else None
        try:
            if execution.workflow_id != run_workflow_id(snapshot.namespace, snapshot.name):
                raise Copied(
                    f"workflow {execution.workflow_id} sent the status of Run {run.namespace}/{run.name}"
                )
            chain = await execution_chain(self.chains, execution, claimed)
            if claimed is not None and claimed != chain:
                raise Copied(
                    f"workflow {execution.workflow_id} run {execution.run_id} claimed execution {claimed}"
                )
            await self.status.mirror(snapshot, chain)
        except Copied as err:
            await self.refused(Activity.MIRROR_STATUS, run, err, execution)
            raise refusal(err) from None

    def all(self) -> list[Any]:
        return [self.resolve_references, self.mirror_status]
