"""Trust boundaries of the agent and of the worker as its caller, each attack made as its attacker would: a local
user messaging a local agent, a card that points elsewhere, a contract that names a host or a file its Secret's
owner never allowed, a tenant naming another team's Secret on a shared endpoint. Real agents over HTTP, the
scripted model as the attacker's listener."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from a2a.client import A2AClientError, ClientConfig, ClientFactory
from a2a.helpers import new_data_part
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agents import AgentActivities, CallerKeys, Timing
from activities.agents.callers import BearerToken, process_keys
from activities.sandboxes import LocalModel, LocalSandboxes, SandboxSettings
from agent.callers import TOKEN_SHA256_ANNOTATION, Claims, endpoint_token
from agent.credentials import host_allowed
from agent.scripted_model import fingerprint
from agent.server import agent_card
from store import Store
from testbed import warrants
from testbed.agents import AgentFactory, ModelEndpoint, contract, serving_model
from testbed.asgi import serving
from workflows.activity_types import AgentInvocation
from workflows.contract import CredentialRef, ExecutionContract, ModelRef

FAST = Timing(heartbeat_seconds=0.5, stall_seconds=2.0, probe_seconds=1.0, cancel_wait_seconds=5.0)
LOCAL_KEY = "sk-the-developers-own-key"
TEAM_B_KEY = "sk-team-b-key"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def attacker() -> AsyncIterator[ModelEndpoint]:
    """The attacker's own OpenAI-compatible listener: it records the key of every call it gets."""
    async with serving_model() as endpoint:
        yield endpoint


def invocation(c: ExecutionContract, endpoint: str) -> AgentInvocation:
    return warrants.invocation(c, endpoint)


async def invoke(store: Store, inv: AgentInvocation, keys: CallerKeys | None = None) -> Any:
    return await ActivityEnvironment().run(AgentActivities(store, FAST, keys).invoke_agent, inv)


def pointed_at(c: ExecutionContract, url: str, credential: CredentialRef) -> ExecutionContract:
    """The contract with its model (the one in use and the agent's) at `url`, using `credential`."""
    model = ModelRef(name="dev-model", url=url, credential=credential)
    return c.model_copy(update={"model": model, "agent": c.agent.model_copy(update={"model": model})})


async def send_as(url: str, c: ExecutionContract, token: str | None) -> list[int]:
    """A message with `c` as its contract, sent straight to the agent (no worker), with `token` or none."""
    async with httpx.AsyncClient(timeout=30) as http:
        client = await ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create_from_url(
            url, interceptors=[BearerToken(lambda: token)]
        )
        message = Message(
            role=Role.ROLE_USER,
            message_id=f"{c.run.uid}-forged",
            context_id=f"{c.run.uid}-forged",
            parts=[Part(text="go"), new_data_part({"ksquad.io/contract": c.for_sandbox()})],
        )
        states: list[int] = []
        async for event in client.send_message(SendMessageRequest(message=message)):
            if event.WhichOneof("payload") == "status_update":
                states.append(event.status_update.status.state)
        return states


async def test_a_local_user_without_the_token_cannot_have_a_local_agent_send_the_developers_key_elsewhere(
    store: Store, model: ModelEndpoint, attacker: ModelEndpoint, tmp_path: Path
) -> None:
    # The local agent of `ksquad dev` holds the developer's key in its environment and listens on loopback, where
    # every local user reaches it. Another user's process sends it a contract naming the key's variable and the
    # attacker's own model URL.
    model.script("dev-model", {"text": "done locally"})
    local_credential = CredentialRef(secret_name="local-model", allowed_hosts=[urlsplit(model.url).netloc])
    sandboxes = LocalSandboxes(
        SandboxSettings(backend="local"),
        LocalModel(model.url, local_credential, LOCAL_KEY),
        log_dir=tmp_path / "sandboxes",
    )
    honest = pointed_at(contract(model, work_item_ref=None), model.url, local_credential)
    sandbox = await sandboxes.acquire(warrants.sandbox_request(honest, 30))
    try:
        stolen = CredentialRef(
            secret_name="local-model", env=local_credential.env, allowed_hosts=[urlsplit(attacker.url).netloc]
        )
        forged = pointed_at(contract(model, uid="uid-forged", work_item_ref=None), attacker.url, stolen)
        for token in (None, "a-token-of-my-own"):
            with pytest.raises(A2AClientError, match="401"):
                await send_as(sandbox.endpoint, forged, token)
        await asyncio.sleep(0.5)
        assert attacker.state.calls == [], "the developer's key never reached the attacker's URL"

        result = await invoke(store, invocation(honest, sandbox.endpoint))  # the worker, with the token
        assert result.outputs == {"answer": "done locally"}
        assert [c.credential for c in model.state.calls] == [fingerprint(f"Bearer {LOCAL_KEY}")]
    finally:
        await sandboxes.release(warrants.sandbox_release(honest, sandbox))


async def test_the_worker_does_not_follow_a_card_that_points_elsewhere(
    store: Store, model: ModelEndpoint
) -> None:
    # The endpoint the worker was given serves a card whose JSON-RPC interface is another server's: the worker
    # would send that server its token and the attempt's contract (prompt, inputs, fence).
    heard: list[str] = []

    async def record(request: Request) -> Response:
        heard.append(f"{request.method} {request.url.path} {await request.body()!r}")
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "no"}})

    elsewhere = Starlette(routes=[Route("/{path:path}", record, methods=["GET", "POST"])])

    async def card(_: Request) -> JSONResponse:
        return JSONResponse(MessageToDict(agent_card(f"{elsewhere_url}/")))

    endpoint = Starlette(routes=[Route("/.well-known/agent-card.json", card)])
    async with serving(elsewhere) as elsewhere_url, serving(endpoint) as endpoint_url:
        with pytest.raises(ApplicationError) as caught:
            await invoke(store, invocation(contract(model, work_item_ref=None), f"{endpoint_url}/"))
    assert caught.value.type == "InvalidAgentResponse"
    assert f"sends its JSON-RPC calls to {elsewhere_url}/" in str(caught.value)
    assert heard == [], "the server the card names heard nothing"


async def test_the_agent_sends_a_credential_only_to_a_host_its_secrets_owner_allows(
    store: Store, model: ModelEndpoint, attacker: ModelEndpoint, start_agent: AgentFactory
) -> None:
    # Even the worker's word does not send a key where its Secret's owner did not allow (defence in depth: the
    # bridge refuses such a route first).
    honest = contract(model, work_item_ref=None)
    credential = honest.model.credential
    assert credential is not None and credential.allowed_hosts == [urlsplit(model.url).netloc]
    c = pointed_at(honest, attacker.url, credential)
    agent = await start_agent(c)
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(c, agent.url))
    assert caught.value.type == "AgentFailed"
    assert f"may not be sent to {urlsplit(attacker.url).netloc}" in str(caught.value)
    assert "ksquad.io/allowed-hosts" in str(caught.value)
    assert attacker.state.calls == []


@pytest.mark.parametrize(
    ("secret", "key"), [("model-key", "../victim/apiKey"), ("..", "victim/apiKey"), ("model-key", "..")]
)
async def test_a_credential_that_is_not_a_plain_file_name_is_refused(
    store: Store, model: ModelEndpoint, start_agent: AgentFactory, tmp_path: Path, secret: str, key: str
) -> None:
    # A warm pod mounts its pool's Secrets side by side: `../` in a key reached the other Secrets' files.
    secrets = tmp_path / "secrets"
    for name in ("model-key", "victim"):
        (secrets / name).mkdir(parents=True)
        (secrets / name / "apiKey").write_text(f"sk-{name}")
    honest = contract(model, work_item_ref=None)
    assert honest.model.credential is not None
    credential = CredentialRef(
        secret_name=secret, key=key, allowed_hosts=honest.model.credential.allowed_hosts
    )
    c = pointed_at(honest, model.url, credential)
    annotations = tmp_path / "annotations"  # the attempt's sandbox (its contract comes in the message)
    annotations.write_text(f'{TOKEN_SHA256_ANNOTATION}="{process_keys().sandbox_token_sha256(c.run)}"\n')
    agent = await start_agent(None, annotations=annotations, secrets_dir=secrets)
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(c, agent.url))
    assert caught.value.type == "AgentFailed"
    assert "invalid execution contract" in str(caught.value)
    assert model.state.calls == [], "no key read, none sent"


async def test_a_shared_endpoint_answers_signed_callers_only_and_reads_only_the_callers_namespace(
    store: Store, model: ModelEndpoint, attacker: ModelEndpoint, start_agent: AgentFactory, tmp_path: Path
) -> None:
    # One agent (Agent.spec.endpoint) serves team-a and team-b. Team B's key is mounted for team B; team A makes a
    # Secret of its own under the same name, pointing its model at its own listener.
    key_file = tmp_path / "endpoint.key"
    key_file.write_bytes(bytes(range(32)))
    secrets = tmp_path / "secrets"
    for where in (
        secrets / "team-b" / "model-key",
        secrets / "model-key",
    ):  # and as mounted before namespaces
        where.mkdir(parents=True)
        (where / "apiKey").write_text(TEAM_B_KEY)
    agent = await start_agent(None, endpoint_key=key_file, secrets_dir=secrets)
    keys = CallerKeys(process_keys().sandbox, endpoint=key_file.read_bytes())
    model.script("dev-model", {"text": "team b's answer"})

    team_a_secret = CredentialRef(secret_name="model-key", allowed_hosts=[urlsplit(attacker.url).netloc])
    team_a = pointed_at(
        contract(model, namespace="team-a", uid="uid-a", work_item_ref=None), attacker.url, team_a_secret
    )
    team_a.agent.endpoint = agent.url
    with pytest.raises(A2AClientError, match="401"):
        await send_as(agent.url, team_a, None)  # no token: refused before anything is read
    with pytest.raises(ApplicationError) as caught:
        await invoke(store, invocation(team_a, agent.url), keys)  # a real attempt of team A, signed
    assert caught.value.type == "CredentialExpired", "team A has no such Secret: nothing to send"
    assert attacker.state.calls == [], "team B's key never reached team A's listener"

    # A token is one attempt's: another attempt's contract is refused with it.
    claims = Claims("team-a", "uid-a", 1, 1, frozenset({("model-key", "apiKey")}), expires=2**31)
    other = team_a.model_copy(update={"run": team_a.run.model_copy(update={"uid": "uid-other"})})
    states = await send_as(agent.url, other, endpoint_token(keys.endpoint or b"", claims))
    assert states[-1] == TaskState.TASK_STATE_FAILED

    team_b = contract(model, namespace="team-b", uid="uid-b", work_item_ref=None)
    team_b.agent.endpoint = agent.url
    result = await invoke(store, invocation(team_b, agent.url), keys)
    assert result.outputs == {"answer": "team b's answer"}
    assert [c.credential for c in model.state.calls] == [fingerprint(f"Bearer {TEAM_B_KEY}")]


@pytest.mark.parametrize(
    ("url", "allowed", "expected"),
    [
        ("https://api.openai.com/v1", ["api.openai.com"], True),
        ("https://api.openai.com/v1", ["api.openai.com:443"], True),
        ("https://api.openai.com/v1", ["api.openai.com:8443"], False),
        ("https://api.openai.com.evil.example/v1", ["api.openai.com"], False),
        ("http://10.1.2.3:8000/v1", ["10.0.0.0/8"], True),
        ("http://model.internal:8000/v1", ["10.0.0.0/8"], False),  # a name is never matched by a CIDR
        ("http://[fd00::5]:8000/v1", ["fd00::/64"], True),
        ("http://[fd00::5]:8000/v1", ["[fd00::5]:8000"], True),
        ("http://127.0.0.1:9/v1", [], False),  # no annotation: nowhere
    ],
)
def test_allowed_hosts_are_hosts_host_ports_or_cidrs(url: str, allowed: list[str], expected: bool) -> None:
    assert host_allowed(url, allowed) is expected
