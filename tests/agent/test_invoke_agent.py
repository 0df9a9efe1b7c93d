"""invoke_agent against the reference agent (its own process), the scripted model and a real MCP server, all
over HTTP on loopback: tool calls, outcomes, error forms, cancellation, dead and malformed agents."""

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agents import AgentActivities, CallerKeys, Timing
from activities.agents.callers import BearerToken, process_keys
from agent.callers import TOKEN_SHA256_ANNOTATION
from agent.scripted_model import fingerprint
from agent.server import agent_card
from store import Holder, StaleFence, Store, work_item_key
from testbed import warrants
from testbed.agents import MODEL_KEY, AgentFactory, ModelEndpoint, ToolServer, contract
from testbed.asgi import serving
from workflows.activity_types import AgentInvocation, ContinueTask, RateLimitDetails, TaskPause

FAST = Timing(heartbeat_seconds=0.5, stall_seconds=2.0, probe_seconds=1.0, cancel_wait_seconds=5.0)
HOLDER = Holder("uid-r", "payments/r", "alice@example.com")
ITEM = work_item_key("payments", "wi-1")  # the contract's run (testbed.agents.contract) works wi-1


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        yield store
    finally:
        await store.close()


async def claimed(store: Store) -> int:
    return (await store.claim(ITEM, HOLDER, 120)).fence


def invocation(
    endpoint: str,
    model: ModelEndpoint,
    tools: ToolServer | None = None,
    *,
    fence: int = 1,
    turn: int = 0,
    follow_up: ContinueTask | None = None,
    **kw: Any,
) -> AgentInvocation:
    c = contract(model, tools, fence=fence, **kw)
    return warrants.invocation(c, endpoint, turn=turn, continue_task=follow_up)


async def invoke(store: Store, inv: AgentInvocation, env: ActivityEnvironment | None = None) -> Any:
    return await (env or ActivityEnvironment()).run(AgentActivities(store, FAST).invoke_agent, inv)


async def test_the_agent_calls_an_allowed_mcp_tool_then_answers_and_everything_is_recorded_with_the_fence(
    store: Store, model: ModelEndpoint, tool_server: ToolServer, start_agent: AgentFactory
) -> None:
    model.script(
        "dev-model",
        {"tool_calls": [{"name": "notes", "arguments": {"text": "retry test is flaky"}}]},
        {"text": "Fixed: the retry test waits for the clock now."},
    )
    fence = await claimed(store)
    agent = await start_agent(contract(model, tool_server, fence=fence))
    result = await invoke(store, invocation(agent.url, model, tool_server, fence=fence))

    assert result.outputs == {"answer": "Fixed: the retry test waits for the clock now."}
    assert [a.name for a in result.artifacts] == ["answer"]
    (call,) = tool_server.calls
    assert (call["tool"], call["text"]) == ("add_note", "retry test is flaky")
    assert call["meta"]["ksquad.io/idempotency-key"] == "uid-r-a1-1"
    assert call["meta"]["ksquad.io/run"] == "payments/r"
    offered = {tuple(c.tools) for c in model.state.calls}
    assert offered == {("notes", "ksquad_request_input")}, "run_shell is not in allowedTools: never offered"
    assert {c.credential for c in model.state.calls} == {fingerprint(f"Bearer {MODEL_KEY}")}, (
        "the model got the agent's credential"
    )

    events = await store.events("uid-r")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.fence for e in events} == {fence}
    assert any("calling tool notes" in e.message for e in events)
    assert events[-1].data["state"] == "TASK_STATE_COMPLETED"
    assert all(e.triggered_by == "alice@example.com" for e in events)
    assert (await agent.stats())["messages"] == 1


async def test_a_tool_call_for_a_tool_never_offered_is_refused_and_never_reaches_the_tool_server(
    store: Store, model: ModelEndpoint, tool_server: ToolServer, start_agent: AgentFactory
) -> None:
    # The model asks for run_shell: the MCP server has it, the Agent's allowedTools does not. A model can name
    # any tool (a prompt injection in the work item can make it); the agent answers it with an error instead.
    model.script(
        "dev-model",
        {"tool_calls": [{"name": "run_shell", "arguments": {"command": "cat /etc/passwd"}}]},
        {"text": "The shell is not mine to use."},
    )
    fence = await claimed(store)
    agent = await start_agent(contract(model, tool_server, fence=fence))
    result = await invoke(store, invocation(agent.url, model, tool_server, fence=fence))

    assert result.outputs == {"answer": "The shell is not mine to use."}
    assert tool_server.calls == [], "nothing reached the tool server"
    first, second = model.state.calls
    assert "run_shell" not in first.tools
    assert second.tool_results == ["tool 'run_shell' is not available to this agent"], second.tool_results


async def test_writes_of_a_fenced_off_holder_are_refused(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", {"text": "done"})
    fence = await claimed(store)
    await store.fence_bump(ITEM, HOLDER, fence)  # the workflow fenced this attempt off
    agent = await start_agent(contract(model, fence=fence))
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(agent.url, model, fence=fence))
    assert caught.value.type == "StaleFence"
    with pytest.raises(StaleFence):
        await store.append_event(HOLDER, fence, 1, "x", work_item_ref=ITEM)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ({"error": 429, "retry_after": "120"}, {"retry_after": "120"}),
        ({"error": 429, "retry_after_ms": "1500"}, {"retry_after_ms": "1500"}),
        ({"error": 429, "retry_after_date_in": 90}, {"http_date": True}),
        ({"error": 429}, {}),
        (
            {
                "error": 429,
                "headers": {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "12ms"},
            },
            {"resets": {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "12ms"}},
        ),
        (
            {"error": 429, "headers": {"anthropic-ratelimit-requests-reset": "2026-12-01T10:00:00Z"}},
            {"resets": {"anthropic-ratelimit-requests-reset": "2026-12-01T10:00:00Z"}},
        ),
    ],
)
async def test_a_429_becomes_rate_limited_with_the_raw_retry_after(
    store: Store,
    model: ModelEndpoint,
    start_agent: AgentFactory,
    step: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    model.script("dev-model", step)
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(agent.url, model, fence=fence))
    assert (caught.value.type, caught.value.non_retryable) == ("RateLimited", True)
    details = RateLimitDetails.model_validate(caught.value.details[0])
    assert details.model == "dev-model"
    assert details.credential == "payments/model-key"
    assert details.response_date, "the response's Date travels with it, for HTTP-date arithmetic"
    if "http_date" in expected:
        assert details.retry_after is not None and details.retry_after.endswith("GMT")
    else:
        assert details.retry_after == expected.get("retry_after")
        assert details.retry_after_ms == expected.get("retry_after_ms")
    assert details.provider_resets == expected.get("resets", {}), "the provider's reset headers, raw"
    assert len(model.state.calls) == 1, "the agent's own retries are off: one call, no hammering"


@pytest.mark.parametrize(
    ("step", "kind", "words"),
    [
        ({"error": 401}, "CredentialExpired", "Incorrect API key"),
        ({"error": 500}, "AgentFailed", "HTTP 500"),
        ({"malformed": True}, "AgentFailed", "malformed response"),
    ],
)
async def test_other_model_errors_map_to_their_outcomes(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory, step: dict[str, Any], kind: str, words: str
) -> None:
    model.script("dev-model", step)
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(agent.url, model, fence=fence))
    assert caught.value.type == kind
    assert words in str(caught.value)
    if kind == "CredentialExpired":
        pause = TaskPause.model_validate(caught.value.details[0])
        assert pause.context_id == "uid-r-a1"


async def test_input_required_pauses_and_a_follow_up_continues_the_same_task(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script(
        "dev-model",
        {"tool_calls": [{"name": "ksquad_request_input", "arguments": {"question": "Which test?"}}]},
        {"text": "Fixed test_payment_retry."},
    )
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(agent.url, model, fence=fence))
    assert caught.value.type == "InputRequired"
    pause = TaskPause.model_validate(caught.value.details[0])
    assert pause.message == "Which test?"
    assert (await agent.stats())["conversations"] == 1, "a paused task keeps its conversation"
    follow_up = ContinueTask(task_id=pause.task_id, context_id=pause.context_id, text="test_payment_retry")
    result = await invoke(store, invocation(agent.url, model, fence=fence, turn=1, follow_up=follow_up))
    assert result.task_id == pause.task_id
    assert result.outputs == {"answer": "Fixed test_payment_retry."}
    stats = await agent.stats()
    assert (stats["messages"], stats["follow_ups"]) == (1, 1)
    assert stats["conversations"] == 0, "an ended task's conversation is forgotten"


async def test_a_warm_sandbox_gets_its_contract_in_the_first_message(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "done warm"})
    fence = await claimed(store)
    annotations = tmp_path / "annotations"  # a pod's downward-API file: no caller until the claim
    agent = await start_agent(None, annotations=annotations)  # a warm pod: started before any run existed
    inv = invocation(agent.url, model, fence=fence)
    call = asyncio.create_task(invoke(store, inv))
    await asyncio.sleep(0.5)  # the first request waits for the kubelet to write the claim's annotation
    digest = process_keys().sandbox_token_sha256(inv.contract.run)
    annotations.write_text(f'other="x"\n{TOKEN_SHA256_ANNOTATION}="{digest}"\n')
    result = await call
    assert result.outputs == {"answer": "done warm"}


async def test_a_long_lived_agents_card_is_read_once_and_again_after_a_failed_call(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "one"}, {"text": "two"}, {"error": 500}, {"text": "four"})
    key = tmp_path / "endpoint.key"
    key.write_bytes(bytes(range(32)))
    secrets = tmp_path / "secrets"
    (secrets / "payments" / "model-key").mkdir(parents=True)
    (secrets / "payments" / "model-key" / "apiKey").write_text(MODEL_KEY)
    # an Agent's `endpoint`: one process serving many runs, checking the tokens the worker signs
    agent = await start_agent(None, endpoint_key=key, secrets_dir=secrets)
    acts = AgentActivities(store, FAST, CallerKeys(process_keys().sandbox, endpoint=key.read_bytes()))
    card_reads: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        if request.url.path.endswith("/.well-known/agent-card.json"):
            card_reads.append(request.url.path)

    acts._http = (asyncio.get_running_loop(), httpx.AsyncClient(event_hooks={"request": [on_request]}))
    outcomes: list[str] = []
    for run in range(4):
        inv = invocation(agent.url, model, uid=f"uid-{run}", work_item_ref=None)
        inv.contract.agent.endpoint = agent.url
        try:
            outcomes.append((await ActivityEnvironment().run(acts.invoke_agent, inv)).outputs["answer"])
        except ApplicationError as err:
            outcomes.append(err.type or "")
        if run == 1:
            assert len(card_reads) == 1, "the second run reused the card"
    await acts.aclose()
    assert outcomes == ["one", "two", "AgentFailed", "four"]
    assert len(card_reads) == 2, "the run after the failed call read the card again"
    assert len(model.state.calls) == 4


async def test_cancellation_reaches_the_agent_which_reports_canceled_and_abandons_the_model_call(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", {"delay": 60, "text": "too late"})
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    env = ActivityEnvironment()
    run = asyncio.create_task(invoke(store, invocation(agent.url, model, fence=fence), env))
    await until(lambda: model.state.in_flight == 1, "the model call to start")
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await until(lambda: model.state.in_flight == 0, "the agent to abandon the model call")
    assert model.state.abandoned == 1
    assert await remote_state(agent.url, "uid-r-a1", contract(model, fence=fence).run) == (
        TaskState.TASK_STATE_CANCELED
    )
    assert (await agent.stats())["cancelled"] == 1


async def test_sigterm_cancels_the_agents_task_and_the_run_hears_why(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", {"delay": 60, "text": "too late"})
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    run = asyncio.create_task(invoke(store, invocation(agent.url, model, fence=fence)))
    await until(lambda: model.state.in_flight == 1, "the model call to start")
    agent.signal(signal.SIGTERM)
    with pytest.raises(ApplicationError) as caught:
        await run
    assert caught.value.type == "AgentFailed"
    assert "cancelled" in str(caught.value)
    # uvicorn re-raises SIGTERM once it has shut down gracefully: the process ends "killed by SIGTERM"
    assert await asyncio.to_thread(agent.process.wait, 10) == -signal.SIGTERM
    assert "SIGTERM: cancelling 1 task(s)" in agent.log.read_text()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
async def test_an_agent_that_stops_answering_ends_in_sandbox_lost_not_a_hang(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory, how: signal.Signals
) -> None:
    model.script("dev-model", {"delay": 60, "text": "never"})
    fence = await claimed(store)
    agent = await start_agent(contract(model, fence=fence))
    run = asyncio.create_task(invoke(store, invocation(agent.url, model, fence=fence)))
    await until(lambda: model.state.in_flight == 1, "the model call to start")
    started = asyncio.get_running_loop().time()
    agent.signal(how)
    try:
        with pytest.raises(ApplicationError) as caught:
            await asyncio.wait_for(run, 30)
    finally:
        if how == signal.SIGSTOP:
            agent.signal(signal.SIGKILL)
    took = asyncio.get_running_loop().time() - started
    assert caught.value.type == "SandboxLost"
    assert "stopped answering" in str(caught.value)
    assert took < 30, "well within the 30 s heartbeat timeout"


async def test_a_malformed_a2a_response_is_a_clear_failure(store: Store, model: ModelEndpoint) -> None:
    async def garbage(_: Request) -> Response:
        return Response('{"jsonrpc": "2.0", "result": ', media_type="application/json")

    async def card(_: Request) -> JSONResponse:
        from google.protobuf.json_format import MessageToDict

        return JSONResponse(MessageToDict(agent_card(base_url)))

    app = Starlette(
        routes=[Route("/.well-known/agent-card.json", card), Route("/", garbage, methods=["POST"])]
    )
    async with serving(app) as url:
        base_url = f"{url}/"
        fence = await claimed(store)
        with pytest.raises(ApplicationError) as caught:
            await invoke(store, invocation(base_url, model, fence=fence))
    assert caught.value.type == "InvalidAgentResponse"
    assert "invalid A2A response" in str(caught.value)


async def test_a_repeated_message_id_never_runs_twice(
    model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", {"delay": 1, "text": "once"})
    c = contract(model)
    agent = await start_agent(c)
    async with httpx.AsyncClient(timeout=30) as http:
        client = await ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create_from_url(
            agent.url, interceptors=[BearerToken(lambda: process_keys().sandbox_token(c.run))]
        )
        states = []
        for _ in range(2):
            message = Message(
                role=Role.ROLE_USER, message_id="uid-r-a1", context_id="uid-r-a1", parts=[Part(text="go")]
            )
            async for event in client.send_message(SendMessageRequest(message=message)):
                if event.WhichOneof("payload") == "status_update":
                    states.append(event.status_update.status.state)
    assert TaskState.TASK_STATE_REJECTED in states
    stats = await agent.stats()
    assert (stats["messages"], stats["duplicates"]) == (1, 1)
    assert len(model.state.calls) == 1


async def until(predicate: Any, what: str, within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def remote_state(url: str, context_id: str, run: Any) -> int:
    from a2a.types import ListTasksRequest

    async with httpx.AsyncClient(timeout=10) as http:
        client = await ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create_from_url(
            url, interceptors=[BearerToken(lambda: process_keys().sandbox_token(run))]
        )
        for _ in range(100):
            (task,) = (await client.list_tasks(ListTasksRequest(context_id=context_id))).tasks
            full = await client.get_task(GetTaskRequest(id=task.id))
            if full.status.state == TaskState.TASK_STATE_CANCELED:
                break
            await asyncio.sleep(0.05)
        return int(full.status.state)
