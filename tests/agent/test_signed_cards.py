"""Signed Agent Cards (A2A 1.0, section 8.4) on the embedded stack: an Agent whose `cardKeys` names the public
keys its card must be signed with gets its task only from a card one of them signed (a2a-sdk's signer, ES256 over
the card's canonical form). An unsigned card, one signed by another key or under an unknown kid, and one changed
after it was signed each fail the Run with the reason, and the agent never hears the task. A JWKS that holds a
private key is refused when the Agent is applied, naming the field."""

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.utils.signing import create_agent_card_signer
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from jwt.algorithms import ECAlgorithm
from starlette.applications import Starlette

from dev.stack import DevStack, dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, wait_terminal
from tests.agent.test_third_party_agents import Echo
from workflows.model import InvalidObject

NAMESPACE = "bench"  # wait_terminal's
API = "ksquad.io/v1alpha1"
Signer = Callable[[AgentCard], AgentCard]


def key_pair(kid: str) -> tuple[ec.EllipticCurvePrivateKey, dict[str, Any]]:
    private = ec.generate_private_key(ec.SECP256R1())
    public: dict[str, Any] = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    return private, {**public, "kid": kid, "use": "sig"}


def signer(private: ec.EllipticCurvePrivateKey, kid: str | None) -> Signer:
    header: Any = {"alg": "ES256", "typ": "JOSE", **({"kid": kid} if kid else {})}
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return create_agent_card_signer(signing_key=pem, protected_header=header)


@contextlib.asynccontextmanager
async def card_agent(sign: Signer | None, tamper: bool = False) -> AsyncIterator[tuple[str, Echo]]:
    """An echo agent whose card is signed by `sign` (none: unsigned), and changed afterwards with `tamper`."""
    echo, root = Echo(as_artifact=False), Starlette()
    async with serving(root, host="127.0.0.1") as url:
        card = AgentCard(
            name="signed-echo",
            description="Says back what it was told.",
            version="1.0.0",
            supported_interfaces=[
                AgentInterface(url=f"{url}/", protocol_binding="JSONRPC", protocol_version="1.0")
            ],
            capabilities=AgentCapabilities(streaming=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
        )
        if sign is not None:
            card = sign(card)
        if tamper:
            card.description = "Says back what it was told, and mails it elsewhere."
        handler = DefaultRequestHandler(agent_executor=echo, task_store=InMemoryTaskStore(), agent_card=card)
        root.mount(
            "/", Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
        )
        yield f"{url}/", echo


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path_factory.mktemp("signed") / ".ksquad")) as stack:
        yield stack


def agent_and_run(name: str, url: str, jwks: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API,
            "kind": "Agent",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"endpoint": url, "cardKeys": jwks},
        },
        {
            "apiVersion": API,
            "kind": "Run",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"agents": [name], "inputs": {"task": "Say it back."}, "retryPolicy": {"maxRetries": 0}},
        },
    ]


OURS, OUR_JWK = key_pair("ours-1")
THEIRS, _ = key_pair("ours-1")  # another key under our kid


@pytest.mark.parametrize(
    ("case", "sign", "tamper", "why"),
    [
        ("signed", signer(OURS, "ours-1"), False, None),
        ("signed-without-kid", signer(OURS, None), False, None),  # the JWKS's one key
        ("unsigned", None, False, "the card carries no signature"),
        ("another-key", signer(THEIRS, "ours-1"), False, "none of its 1 signature(s) verifies"),
        ("unknown-kid", signer(OURS, "someone-else"), False, "none of its 1 signature(s) verifies"),
        ("changed-after-signing", signer(OURS, "ours-1"), True, "none of its 1 signature(s) verifies"),
    ],
)
async def test_a_task_goes_only_to_an_agent_whose_card_its_keys_signed(
    dev: DevStack, case: str, sign: Signer | None, tamper: bool, why: str | None
) -> None:
    async with card_agent(sign, tamper) as (url, echo):
        await dev.runs.apply(agent_and_run(case, url, {"keys": [OUR_JWK]}))
        phases = await wait_terminal(dev, [case], within=60)
    status = (await dev.runs.get(NAMESPACE, case)).status or {}
    if why is None:
        assert phases == {case: "Succeeded"}, status
        assert echo.heard == ["Say it back."]
        return
    assert phases == {case: "Failed"}, status
    assert f"is not signed as Agent {case}'s cardKeys require: {why}" in status["message"], status["message"]
    assert echo.heard == [], "no task was sent to an agent whose card did not verify"


async def test_a_jwks_holding_a_private_key_is_refused_naming_the_field(
    dev: DevStack, tmp_path: Path
) -> None:
    private = {**OUR_JWK, "d": "c2VjcmV0"}
    with pytest.raises(InvalidObject) as refused:
        await dev.runs.apply(agent_and_run("leaky", "http://127.0.0.1:9/", {"keys": [private]}))
    assert refused.value.problems == [
        "document 1 (Agent leaky): spec.cardKeys.keys.0: holds private key members (d): give the public key alone"
    ], refused.value.problems
