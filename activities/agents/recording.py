"""The fenced record of one agent turn: status updates become run events (rate-limited), artifacts are stored,
outputs taken; each write carries the attempt's fence, so a holder fenced off by the workflow cannot write. Usage
reports (a status update's `ksquad.io/usage`) are recorded once per call, fence or not: a call made is paid for."""

import json
import logging
from contextlib import suppress
from typing import Any

from a2a.helpers import get_data_parts, get_message_text, get_text_parts
from a2a.types import Message, Task, TaskState
from temporalio.exceptions import ApplicationError

from activities.agents.outcomes import agent_error
from activities.agents.progress import OUTPUTS_ARTIFACT, Progress
from activities.claims import as_activity_error
from activities.metrics import MODEL_CALLS, MODEL_TOKENS
from store import Author, Holder, ItemNotFound, ModelCall, StaleFence, Store, StoreError, work_item_key
from workflows.activity_types import AgentError, FailureDetails
from workflows.contract import RunIdentity
from workflows.status import Artifact

log = logging.getLogger(__name__)
USAGE_KEY = "ksquad.io/usage"  # a status update's metadata: one model call's cost (agent.reports.USAGE_KEY)
OTHER_MODEL = "other"  # the metrics' model label for a reported model the contract does not name
MAX_TOKENS_PER_CALL = 1 << 32  # a report above it is not a call's usage: dropped, with a warning
MAX_ARTIFACT_BYTES = 1 << 20  # stored inline; larger artifacts are refused as invalid responses
MAX_ARTIFACTS = 64  # per attempt: they are listed in the Run's status, which must stay small
# Distinct model calls one turn may report: a row each in the store, so an agent that reports a new call id in
# every update would otherwise fill the usage table. Forty times what the reference agent can make (MAX_STEPS).
MAX_MODEL_CALLS = 1_000


class Recorder:
    """Writes what one turn of one attempt produced, fenced."""

    def __init__(
        self,
        store: Store,
        holder: Holder,
        identity: RunIdentity,
        progress: Progress,
        credentials: dict[str, str] | None = None,
        token_budget_left: int | None = None,
    ) -> None:
        self.store = store
        self.holder = holder
        self.identity = identity
        self.progress = progress
        self.credentials = credentials or {}  # each model of the contract -> the credential it gives it
        self.token_budget_left = token_budget_left  # what the Run may still use (None: no budget)
        self.tokens_this_turn = 0
        self.calls_this_turn: set[tuple[int, str]] = (
            set()
        )  # (attempt, call id) reported in this turn, recorded once
        ref = identity.work_item_ref
        self.item_key = (
            None if ref is None else work_item_key(identity.namespace, ref)
        )  # what its claim is under

    async def status(self, state: int, message: Message, metadata: dict[str, Any]) -> None:
        progress = self.progress
        if USAGE_KEY in metadata:  # counted whether or not the progress itself is stored
            reports = metadata[USAGE_KEY]
            # A list: a resumed agent's reports of earlier attempts' calls (agent.journal), recorded if missing.
            for report in reports[:MAX_MODEL_CALLS] if isinstance(reports, list) else [reports]:
                await self.usage(report)
        if not progress.may_record(state):
            return
        text = get_message_text(message) if message.parts else ""
        data = {"state": TaskState.Name(state), **_small(metadata)}
        if progress.coalesced:
            data["coalesced"] = progress.coalesced
        await self._fenced(
            self.store.append_event(
                self.holder,
                self.identity.fence,
                self.identity.attempt,
                "status",
                text[:4000],
                data,
                work_item_ref=self.item_key,
            )
        )
        progress.recorded_state, progress.coalesced = state, 0

    async def usage(self, report: Any) -> None:
        """One model call's usage, recorded once per call id of this attempt and counted in the metrics. Charged
        to the credential the contract gives the call's model (never one the agent names) and to the person
        who started the Run. A report not in the documented shape is dropped with a warning: it is an account,
        not the answer, and fails nothing."""
        call = usage_call(report)
        if call is None:
            log.warning("%s: usage report not understood, dropped: %.200r", self.holder.run, report)
            return
        call_id, model, tokens_in, tokens_out, latency_ms = call
        # An earlier attempt's call (a resumed agent's report again): that attempt's row, if it has none yet.
        attempt = report.get("attempt", self.identity.attempt)
        if not (
            isinstance(attempt, int | float)
            and attempt == int(attempt)
            and 1 <= attempt <= self.identity.attempt
        ):
            log.warning(
                "%s: usage report of no attempt up to this one, dropped: %.200r", self.holder.run, report
            )
            return
        attempt = int(attempt)
        if (attempt, call_id) in self.calls_this_turn:
            return  # reported again: recorded already (the store would refuse it too; no round trip for it)
        if len(self.calls_this_turn) >= MAX_MODEL_CALLS:
            message = f"more than {MAX_MODEL_CALLS} model calls reported in one turn (the next was {call_id})"
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                message,
                FailureDetails(message=message, task_id=self.progress.task_id),
            )
        self.calls_this_turn.add((attempt, call_id))
        identity, holder = self.identity, self.holder
        credential = self.credentials.get(model, "")
        recorded = await self._fenced(
            self.store.record_usage(
                ModelCall(
                    namespace=identity.namespace,
                    run=holder.run,
                    run_uid=holder.uid,
                    attempt=attempt,
                    call_id=call_id,
                    model=model,
                    credential=credential,
                    triggered_by=holder.triggered_by or "",
                    input_tokens=tokens_in,
                    output_tokens=tokens_out,
                    latency_ms=latency_ms,
                )
            )
        )
        if recorded:
            # The metric's model label only from the contract's models: an agent naming a new model in every
            # report would otherwise make a new series each time (the store keeps the name it reported).
            known = model if model in self.credentials else OTHER_MODEL
            labels = (identity.namespace, credential, known, holder.triggered_by or "")
            MODEL_CALLS.labels(*labels).inc()
            MODEL_TOKENS.labels(*labels, "input").inc(tokens_in)
            MODEL_TOKENS.labels(*labels, "output").inc(tokens_out)
            self.tokens_this_turn += tokens_in + tokens_out
        left = self.token_budget_left
        if left is not None and self.tokens_this_turn > left:
            # The call that passed the budget is made and counted; no further one is: the activity cancels the
            # agent's task. (The reference agent stops by itself before a call once the budget is used up.)
            message = (
                f"the Run's token budget is spent: call {call_id} of attempt {identity.attempt} ({model}) "
                f"brought this turn to {self.tokens_this_turn} tokens, past the {left} it had left"
            )
            raise agent_error(
                AgentError.TOKEN_BUDGET_SPENT,
                message,
                FailureDetails(message=message, task_id=self.progress.task_id),
            )

    async def artifact(self, artifact: Any) -> None:
        # An unnamed artifact is named by its place (its id is a UUID, which says nothing to a user).
        name = artifact.name or f"artifact-{len(self.progress.artifacts) + 1}"
        data = get_data_parts(list(artifact.parts))
        texts = get_text_parts(list(artifact.parts))
        if name == OUTPUTS_ARTIFACT:
            for part in data:
                self.progress.take_outputs(part)
            return
        if len(self.progress.artifacts) >= MAX_ARTIFACTS:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"more than {MAX_ARTIFACTS} artifacts in one attempt (the next was {name})",
                FailureDetails(message=f"more than {MAX_ARTIFACTS} artifacts", task_id=self.progress.task_id),
            )
        content = ("\n".join(texts) if texts else json.dumps(data)).encode()
        if len(content) > MAX_ARTIFACT_BYTES:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"artifact {name} is {len(content)} bytes, more than the {MAX_ARTIFACT_BYTES} allowed",
                FailureDetails(message="artifact too large", task_id=self.progress.task_id),
            )
        media_type = "text/plain" if texts else "application/json"
        if texts:
            self.progress.answer = "\n".join(texts)
        await self._fenced(
            self.store.put_artifact(
                self.holder,
                self.identity.fence,
                name,
                media_type=media_type,
                content=content,
                work_item_ref=self.item_key,
            )
        )
        published = Artifact(
            name=name,
            media_type=media_type,
            size=len(content),
            uri=f"ksquad://runs/{self.identity.uid}/artifacts/{name}",
        )
        self.progress.artifacts.append(published)
        await self._on_item(published)

    async def _on_item(self, artifact: Artifact) -> None:
        """The artifact in the record of the Run's work item, as this attempt's (a ref that names no item is a
        lock key alone: nothing to record)."""
        identity, holder = self.identity, self.holder
        if identity.work_item_ref is None:
            return
        author = Author(holder.triggered_by, holder.run, holder.uid, identity.attempt)
        entry = {
            "name": artifact.name,
            "mediaType": artifact.media_type,
            "size": artifact.size,
            "uri": artifact.uri,
        }

        async def add() -> None:
            with suppress(ItemNotFound):
                await self.store.add_item_artifact(
                    identity.namespace, identity.work_item_ref or "", entry, author, holder, identity.fence
                )

        await self._fenced(add())

    async def catch_up_artifacts(self, task: Task) -> None:
        """A task read whole (found again after a restart, or probed after a broken stream) carries artifacts
        whose stream events this call never saw."""
        seen = {a.name for a in self.progress.artifacts}
        for artifact in task.artifacts:
            name = artifact.name or artifact.artifact_id
            if name == OUTPUTS_ARTIFACT or name not in seen:
                await self.artifact(artifact)

    async def _fenced(self, write: Any) -> Any:
        try:
            return await write
        except StaleFence as err:
            raise ApplicationError(f"fenced off: {err}", type="StaleFence", non_retryable=True) from None
        except StoreError as err:
            raise as_activity_error(err) from None


def usage_call(report: Any) -> tuple[str, str, int, int, int] | None:
    """(call id, model, input tokens, output tokens, latency ms) of a usage report, or None when it is not one."""
    if not isinstance(report, dict):
        return None
    call_id, model = report.get("callId"), report.get("model")
    numbers = [report.get("inputTokens"), report.get("outputTokens"), report.get("latencyMs", 0)]
    if not (
        isinstance(call_id, str)
        and 0 < len(call_id) <= 64
        and isinstance(model, str)
        and 0 < len(model) <= 256
    ):
        return None
    # JSON numbers arrive as floats through protobuf's Struct: whole ones only.
    if not all(
        isinstance(n, int | float)
        and not isinstance(n, bool)
        and n == int(n)
        and 0 <= n < MAX_TOKENS_PER_CALL
        for n in numbers
    ):
        return None
    tokens_in, tokens_out, latency = (int(n) for n in numbers)
    return call_id, model, tokens_in, tokens_out, latency


def _small(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in list(metadata.items())[:20] if len(json.dumps(v, default=str)) < 1000}
