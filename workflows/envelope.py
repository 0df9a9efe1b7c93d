"""The Run as one thing: the envelope the bridge starts its workflow with, and the warrant the worker acts on.

Whoever may write to the Temporal namespace can start a workflow with any input and, holding the codec, encode
any payload. So nothing in a workflow's input or an activity's arguments is taken at its word field by field:

- the **envelope** is the whole start input (namespace, name, uid, generation, the person who created the Run,
  the spec with its inputs and work item) and the workflow id it was started under, sealed by the bridge (or the
  embedded stack) with the key only it and the worker hold (temporal_client.seal);
- the **warrant** is the envelope with the resolution the bridge made of it (every agent, model, credential and
  the hosts it may reach, the sandbox policy, placement, concurrency scopes, fair-share weight, token budget),
  sealed again together with the execution it was made for: the first run id of the workflow's chain, which
  only the Temporal server assigns. The bridge records that chain on the Run when it starts the workflow and
  resolves for no other, so a copy of the envelope started under another workflow id, or under the same id after
  the Run's workflow closed, gets no warrant.

Every activity that acts (claims, sandboxes, the agent call, outputs, messages to the entity workflows, the
resume ramp) takes the warrant, and the worker checks it against what the server says of the activity's own
workflow id and run before the activity runs (worker.seals); what the activity acts on is built from the warrant
(the contract of `Warrant.contract`), not taken beside it. Fields the workflow derives later (the status revision,
what it carries over continue-as-new) come from its own history: a carried state is taken only from the
workflow's own continue-as-new.
"""

from typing import Literal

from pydantic import Field
from temporalio import workflow

from workflows.contract import ExecutionContract, ModelRef, Resolution, ResolvedAgent, RunIdentity
from workflows.model import KsquadModel
from workflows.spec import K8sName, RunSpec, run_workflow_id


class RunRef(KsquadModel):
    namespace: str
    name: str
    uid: str
    triggered_by: str | None = None


class RunEnvelope(KsquadModel):
    """What the bridge starts a Run's workflow with, sealed."""

    namespace: K8sName
    name: K8sName
    uid: str
    generation: int = 1
    triggered_by: str | None = None  # the user who created the Run, stamped at admission
    spec: RunSpec
    # The starter's HMAC over the fields above and the workflow id (temporal_client.seal). None: not sealed, and
    # refused by the bridge and the worker.
    seal: str | None = None

    @property
    def workflow_id(self) -> str:
        return run_workflow_id(self.namespace, self.name)

    @property
    def run_ref(self) -> RunRef:
        return RunRef(namespace=self.namespace, name=self.name, uid=self.uid, triggered_by=self.triggered_by)

    def sealed_fields(self) -> dict[str, object]:
        """What the seal covers (the envelope's own fields: a subclass's, such as a carry, are not)."""
        fields = set(RunEnvelope.model_fields) - {"seal"}
        body: dict[str, object] = self.model_dump(mode="json", include=fields)
        return body

    def envelope(self) -> "RunEnvelope":
        """The envelope alone (without what a subclass adds)."""
        return RunEnvelope.model_validate(self.model_dump(include=set(RunEnvelope.model_fields)))


ModelChoice = Literal["agent", "fallback", "project"]


class RouteChoice(KsquadModel):
    """Which of the warrant's agents an attempt runs, on which of its models."""

    agent_index: int = Field(default=0, ge=0)
    model: ModelChoice = "agent"


class NotInWarrant(ValueError):
    """A route the warrant does not hold (an agent or a model the bridge did not resolve)."""


class Warrant(KsquadModel):
    envelope: RunEnvelope
    resolution: Resolution

    @property
    def run_ref(self) -> RunRef:
        return self.envelope.run_ref

    @property
    def workflow_id(self) -> str:
        return self.envelope.workflow_id

    def agent(self, route: RouteChoice) -> ResolvedAgent:
        agents = self.resolution.agents
        if route.agent_index >= len(agents):
            raise NotInWarrant(f"agent #{route.agent_index} of {len(agents)} resolved")
        return agents[route.agent_index]

    def model(self, route: RouteChoice) -> ModelRef:
        agent = self.agent(route)
        model = {
            "agent": agent.model,
            "fallback": agent.fallback_model,
            "project": agent.project_fallback_model,
        }
        chosen = model[route.model]
        if chosen is None:
            raise NotInWarrant(f"agent {agent.name} has no {route.model} model")
        return chosen

    def contract(self, route: RouteChoice, attempt: int, fence: int) -> ExecutionContract:
        """What an attempt's sandbox and agent are told: built from the warrant alone."""
        envelope = self.envelope
        identity = RunIdentity(
            namespace=envelope.namespace,
            name=envelope.name,
            uid=envelope.uid,
            attempt=attempt,
            fence=fence,
            triggered_by=envelope.triggered_by,
            work_item_ref=envelope.spec.work_item_ref,
        )
        return ExecutionContract(
            run=identity, inputs=envelope.spec.inputs, agent=self.agent(route), model=self.model(route)
        )


def continued_by_itself() -> bool:
    """This run of the workflow was continued as new by the run before it (not started by a client, nor run again
    by a cron schedule or a retry policy a client gave it, which would hand the client's input on): only then is
    a carried state the workflow's own."""
    info = workflow.info()
    return info.continued_run_id is not None and not info.cron_schedule and info.retry_policy is None
