"""`invoke_agent`: one agent turn over A2A, idempotent across activity retries.

- One message per attempt (`messageId = <run-uid>-a<attempt>`, follow-ups `-t<turn>`), in a context of the
  attempt's own (`<run-uid>-a<attempt>`). Before sending, a retried activity looks for the task it started:
  the task id in its heartbeat details, else a task in the attempt's context holding this message id. It
  resubscribes to that task (or reads it, when it is already over) instead of starting a second one.
- Events stream in: status messages become run events and artifacts are stored, each write fenced (a holder
  fenced off by the workflow cannot write); the claim's lease is renewed meanwhile; the activity heartbeats
  the remote task id.
- Outcomes: COMPLETED returns outputs; everything else raises a typed, non-retryable ApplicationError
  (RateLimited with the raw Retry-After, CredentialExpired, InputRequired, AgentFailed with the agent's
  message, InvalidAgentResponse, SandboxLost) the workflow maps to its policies.
- Cancelled (the run is cancelled, paused or throttled): CancelTask, then wait (bounded) for CANCELED.
- Every request carries the attempt's caller token, and the agent's card is followed only on its endpoint
  (activities.agents.callers).
"""

import asyncio
import contextlib
import logging
import time

import httpx
from a2a.client import (
    A2ACardResolver,
    AgentCardResolutionError,
    Client,
    ClientConfig,
    ClientFactory,
)
from a2a.client.interceptors import ClientCallInterceptor
from a2a.types import (
    AgentCard,
)
from a2a.utils.errors import A2AError
from opentelemetry.trace import Span
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

import tracing
from activities.agents.a2a_compat import A2ACompatTransport
from activities.agents.callers import BearerToken, CallerKeys, off_endpoint, process_keys
from activities.agents.card_signatures import card_not_signed
from activities.agents.invocation import Invocation, cancel_and_wait
from activities.agents.outcomes import agent_error
from activities.agents.progress import OUTPUTS_ARTIFACT, Progress, Timing, previous_task_id
from activities.claims import as_activity_error, holder_of, keep_lease
from activities.metrics import AGENT_CALL_SECONDS, Stopwatch
from store import Holder, Store, StoreError, work_item_key
from workflows.activity_types import (
    USAGE_DETAIL,
    Activity,
    AgentError,
    AgentInvocation,
    AgentResult,
    FailureDetails,
    RunRef,
)
from workflows.contract import ExecutionContract
from workflows.status import UsageStatus

log = logging.getLogger(__name__)

__all__ = ["OUTPUTS_ARTIFACT", "AgentActivities", "CallerKeys", "Timing"]

# An agent's card is read once per endpoint for this long: a long-lived agent (an Agent's `endpoint`) served a
# card request for every run, a third of its work for a short task. Sandboxes have an endpoint each, so for
# them nothing changes; a failed call forgets its endpoint's card.
CARD_TTL_SECONDS = 30.0
MAX_CACHED_CARDS = 256


def attempt_span(inv: AgentInvocation) -> contextlib.AbstractContextManager[Span]:
    """The span of this agent call (tracing.attempt_span: a retry's attempt starts a trace of its own), with who
    started the Run, the agent and the credential by name."""
    contract = inv.contract
    run, credential = contract.run, contract.model.credential
    attributes = {
        **tracing.run_attributes(
            run.namespace,
            run.name,
            run.uid,
            run.triggered_by,
            run.attempt,
            contract.agent.name,
            credential.secret_name if credential else None,
        ),
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.request.model": contract.model.name,
        "gen_ai.conversation.id": inv.context_id,
        "ksquad.turn": inv.turn,
        "server.address": inv.endpoint,
    }
    first_call = inv.turn == 0 and activity.info().attempt == 1
    return tracing.attempt_span(
        f"invoke_agent {contract.agent.name}", run.uid, run.attempt, first_call, attributes
    )


def card_cache_key(inv: AgentInvocation) -> str:
    """The endpoint, and the keys its card was checked against: a card one Agent's keys verified is not taken as
    verified for another Agent naming the same endpoint."""
    keys = inv.contract.agent.card_keys
    return f"{inv.endpoint} {keys.model_dump_json() if keys else ''}"


class AgentActivities:
    def __init__(self, store: Store, timing: Timing | None = None, keys: CallerKeys | None = None) -> None:
        self.store = store
        self.timing = timing or Timing()
        self.keys = keys or process_keys()
        self._http: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self._cards: dict[str, tuple[float, AgentCard]] = {}  # card_cache_key -> (read at, monotonic; card)

    async def work_item_for(self, contract: ExecutionContract) -> dict[str, str] | None:
        """The attempt's access to its Run's work item, when the workItemRef names an item of the namespace (an
        opaque ref, or a worker without an items API, gives none). The item is context: a store that does not
        answer leaves the attempt without it, never fails it."""
        run = contract.run
        if run.work_item_ref is None or self.keys.items is None:
            return None
        try:
            if await self.store.find_item(run.namespace, run.work_item_ref) is None:
                return None
        except StoreError as err:
            log.warning("%s/%s: its work item is not given to the agent: %s", run.namespace, run.name, err)
            return None
        return self.keys.work_item_access(run)

    def http(self) -> httpx.AsyncClient:
        """One HTTP client for every call: a new one per call builds a TLS context each time (README,
        "Benchmarks"), and connections to a long-lived agent are kept. Streams are long, so connections are not capped."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop or self._http[1].is_closed:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(30.0, read=self.timing.stall_seconds),
                transport=A2ACompatTransport(httpx.AsyncHTTPTransport(limits=limits)),
                # W3C traceparent on every A2A request: A2A defines no propagation of its own yet (A2A #2103).
                event_hooks={"request": [tracing.inject_into_request]},
            )
            self._http = (loop, client)
        return self._http[1]

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http[1].aclose()
            self._http = None

    @activity.defn(name=Activity.INVOKE_AGENT)
    async def invoke_agent(self, inv: AgentInvocation) -> AgentResult:
        run = inv.contract.run
        holder = holder_of(
            RunRef(namespace=run.namespace, name=run.name, uid=run.uid, triggered_by=run.triggered_by)
        )
        try:
            if run.work_item_ref is None:
                await self.store.begin_attempt(holder, run.attempt)
        except StoreError as err:
            raise as_activity_error(err) from None
        progress = Progress(task_id=previous_task_id())
        beat = asyncio.create_task(self._heartbeat(progress))
        turn, outcome = Stopwatch(), "error"
        try:
            async with (
                keep_lease(
                    self.store,
                    None if run.work_item_ref is None else work_item_key(run.namespace, run.work_item_ref),
                    holder,
                    run.fence,
                    self.timing.lease_seconds,
                    self.timing.lease_seconds / 3,
                ) as lease,
                contextlib.AsyncExitStack() as stack,
            ):
                span = stack.enter_context(attempt_span(inv))
                client = await self._connect(self.http(), inv)
                try:
                    call = Invocation(self, client, inv, holder, progress)
                    work = asyncio.ensure_future(call.run())
                    lost = asyncio.ensure_future(lease.lost.wait())
                    try:
                        await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
                    except asyncio.CancelledError:
                        await cancel_and_wait(work)
                        # The worker stopping is not the run being cancelled: the agent's task goes on, and the
                        # activity's retry (on this worker restarted, or another) resubscribes to it.
                        if not activity.is_worker_shutdown() and not await call.cancel_remote():
                            raise call.cancel_unconfirmed() from None
                        raise
                    finally:
                        lost.cancel()
                    if not work.done():  # the claim moved to another holder: stop acting for the run
                        await cancel_and_wait(work)
                        await call.cancel_remote()
                        raise ApplicationError(
                            f"lost the claim: {lease.reason}", type="StaleFence", non_retryable=True
                        )
                    result = work.result()
                    outcome = "completed"
                    span.set_attribute("a2a.task.id", result.task_id)
                    return result.model_copy(update={"usage": await self._attempt_usage(holder, run.attempt)})
                except ApplicationError as err:
                    outcome = err.type or "error"
                    self._cards.pop(card_cache_key(inv), None)  # the next attempt reads the card again
                    if err.type == AgentError.TOKEN_BUDGET_SPENT:
                        await call.cancel_remote()  # no call after the one that spent the budget
                    usage = await self._attempt_usage(holder, run.attempt)
                    if usage is None or len(err.details) != USAGE_DETAIL:
                        raise
                    raise ApplicationError(
                        err.message,
                        *err.details,
                        usage.model_dump(mode="json"),
                        type=err.type,
                        non_retryable=err.non_retryable,
                    ) from err.__cause__
                finally:
                    await client.close()
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            beat.cancel()
            AGENT_CALL_SECONDS.labels(outcome).observe(turn.seconds())

    async def _attempt_usage(self, holder: Holder, attempt: int) -> UsageStatus | None:
        """The attempt's model usage as recorded (every turn's, each call once), or None: no calls, or a store
        that cannot say now (the Run's status then counts it at the attempt's next turn, or not at all)."""
        try:
            total = await self.store.run_usage(holder.uid, attempt)
        except StoreError as err:
            log.warning("%s: usage of attempt %d unknown: %s", holder.run, attempt, err)
            return None
        if not total.calls:
            return None
        return UsageStatus(
            calls=total.calls, input_tokens=total.input_tokens, output_tokens=total.output_tokens
        )

    async def _connect(self, http: httpx.AsyncClient, inv: AgentInvocation) -> Client:
        factory = ClientFactory(ClientConfig(streaming=True, httpx_client=http))
        interceptors: list[ClientCallInterceptor] = [BearerToken(lambda: self.keys.token(inv.contract))]
        now = time.monotonic()
        keys = inv.contract.agent.card_keys
        cache_key = card_cache_key(inv)
        cached = self._cards.get(cache_key)
        if cached is not None and now - cached[0] < CARD_TTL_SECONDS:
            return factory.create(cached[1], interceptors)
        token = self.keys.token(inv.contract)
        try:
            card = await A2ACardResolver(http, inv.endpoint).get_agent_card(
                http_kwargs={"headers": {"Authorization": f"Bearer {token}"}} if token else None
            )
            elsewhere = off_endpoint(card, inv.endpoint)
            unsigned = card_not_signed(card, keys) if keys is not None else None
            if elsewhere is None and unsigned is None:
                client = factory.create(card, interceptors)
        except AgentCardResolutionError as err:
            raise agent_error(
                AgentError.SANDBOX_LOST,
                f"cannot reach the agent at {inv.endpoint}: {err.message}",
                FailureDetails(message=f"agent card: {err.message}"),
            ) from None
        except (A2AError, ValidationError, ValueError) as err:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"invalid agent card at {inv.endpoint}: {err}",
                FailureDetails(message=str(err)),
            ) from None
        if unsigned is not None:
            why = (
                f"the agent card at {inv.endpoint} is not signed as Agent {inv.contract.agent.name}'s cardKeys "
                f"require: {unsigned}; no task was sent"
            )
            raise agent_error(AgentError.INVALID_AGENT_RESPONSE, why, FailureDetails(message=why))
        if elsewhere is not None:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"the agent card at {inv.endpoint} sends its JSON-RPC calls to {elsewhere}, off the agent's "
                "endpoint: not followed",
                FailureDetails(message=f"agent card points at {elsewhere}"),
            )
        self._cards.pop(cache_key, None)
        if len(self._cards) >= MAX_CACHED_CARDS:
            self._cards = {e: c for e, c in self._cards.items() if now - c[0] < CARD_TTL_SECONDS}
            while len(self._cards) >= MAX_CACHED_CARDS:
                del self._cards[next(iter(self._cards))]  # the oldest read
        self._cards[cache_key] = (now, card)
        return client

    async def _heartbeat(self, progress: Progress) -> None:
        while True:
            activity.heartbeat(progress.heartbeat())
            await asyncio.sleep(self.timing.heartbeat_seconds)
