"""Warrants for tests and benchmarks of single activities: a contract (testbed.agents.contract) made into the
warrant the worker's activities take (workflows.envelope), and the requests built on it.

Sealed with `sealer` for a worker that checks warrants (worker.seals), for the execution `chain`; unsealed
otherwise (an activity run on its own, as `ActivityEnvironment` does, checks nothing)."""

from temporal_client.seal import Sealer
from workflows.activity_types import (
    AgentInvocation,
    ContinueTask,
    OutputsRequest,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)
from workflows.contract import ExecutionContract, Resolution
from workflows.envelope import ModelChoice, RouteChoice, RunEnvelope, RunRef, Warrant
from workflows.spec import SandboxPolicy, parse_run_spec
from workflows.status import Artifact


def warrant_of(
    contract: ExecutionContract,
    *,
    policy: SandboxPolicy | None = None,
    run_seconds: int | None = None,
    sealer: Sealer | None = None,
    chain: str = "test-chain",
) -> tuple[Warrant, RouteChoice]:
    """The warrant the contract would be built from, and the route to its model."""
    agent = contract.agent
    if policy is not None:
        agent = agent.model_copy(update={"sandbox_policy": policy})
    choices: dict[ModelChoice, object] = {
        "agent": agent.model,
        "fallback": agent.fallback_model,
        "project": agent.project_fallback_model,
    }
    choice: ModelChoice = next((c for c, m in choices.items() if m == contract.model), "agent")
    if choices[choice] != contract.model:
        agent = agent.model_copy(update={"model": contract.model})
    run = contract.run
    spec: dict[str, object] = {"agents": [agent.name], "inputs": contract.inputs}
    if run.work_item_ref is not None:
        spec["workItemRef"] = run.work_item_ref
    if run_seconds is not None:
        spec["timeouts"] = {"runSeconds": run_seconds}
    envelope = RunEnvelope(
        namespace=run.namespace,
        name=run.name,
        uid=run.uid,
        triggered_by=run.triggered_by,
        spec=parse_run_spec(spec),
    )
    resolution = Resolution(outcome="resolved", agents=[agent])
    if sealer is not None:
        envelope = sealer.seal_envelope(envelope)
        resolution = sealer.seal_warrant(envelope, chain, resolution)
    return Warrant(envelope=envelope, resolution=resolution), RouteChoice(model=choice)


def sandbox_request(
    contract: ExecutionContract,
    timeout: int = 60,
    *,
    policy: SandboxPolicy | None = None,
    run_seconds: int = 600,
    sealer: Sealer | None = None,
) -> SandboxRequest:
    warrant, route = warrant_of(contract, policy=policy, run_seconds=run_seconds, sealer=sealer)
    return SandboxRequest(
        warrant=warrant,
        route=route,
        attempt=contract.run.attempt,
        fence=contract.run.fence,
        timeout_seconds=timeout,
    )


def invocation(
    contract: ExecutionContract,
    sandbox: Sandbox | str,
    *,
    turn: int = 0,
    continue_task: ContinueTask | None = None,
    token_budget_left: int | None = None,
    sealer: Sealer | None = None,
) -> AgentInvocation:
    """An agent call of the contract's attempt at `sandbox` (or at a URL: an agent running as a test made it)."""
    if isinstance(sandbox, str):
        kind = "external" if contract.agent.endpoint else "local"
        sandbox = Sandbox(name=contract.agent.name, kind=kind, endpoint=sandbox)
    warrant, route = warrant_of(contract, sealer=sealer)
    return AgentInvocation(
        warrant=warrant,
        route=route,
        attempt=contract.run.attempt,
        fence=contract.run.fence,
        sandbox=sandbox,
        turn=turn,
        continue_task=continue_task,
        token_budget_left=token_budget_left,
    )


def sandbox_release(contract: ExecutionContract, sandbox: Sandbox, confirm: bool = False) -> SandboxRelease:
    warrant, _ = warrant_of(contract)
    return SandboxRelease(warrant=warrant, sandbox=sandbox, confirm=confirm)


def outputs_request(
    contract: ExecutionContract, outputs: dict[str, str], artifacts: list[Artifact] | None = None
) -> OutputsRequest:
    warrant, _ = warrant_of(contract)
    return OutputsRequest(
        warrant=warrant,
        attempt=contract.run.attempt,
        fence=contract.run.fence,
        outputs=outputs,
        artifacts=artifacts or [],
    )


def plain_warrant(
    namespace: str = "ns",
    name: str = "r",
    uid: str = "uid-r",
    *,
    triggered_by: str | None = None,
    work_item_ref: str | None = None,
) -> Warrant:
    """An unsealed warrant of a Run that names one agent (and a work item): for activities run on their own."""
    spec: dict[str, object] = {"agents": ["dev-1"]}
    if work_item_ref is not None:
        spec["workItemRef"] = work_item_ref
    envelope = RunEnvelope(
        namespace=namespace, name=name, uid=uid, triggered_by=triggered_by, spec=parse_run_spec(spec)
    )
    return Warrant(envelope=envelope, resolution=Resolution(outcome="resolved"))


def run_warrant(run: RunRef, work_item_ref: str | None = None) -> Warrant:
    return plain_warrant(
        run.namespace, run.name, run.uid, triggered_by=run.triggered_by, work_item_ref=work_item_ref
    )
