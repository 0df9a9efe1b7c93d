"""The fair limit of bench.overhead: the least any workflow-per-Run design must do to run a Run's agent turn. One
Temporal workflow per task, on the same server as ksquad's, whose one activity sends the same A2A message to the
same agent (the same contract, so the same model and the same answer) and returns the answer's text.

Nothing else of ksquad is in it: no CRD, no status mirrored, no claim or lease, no usage recorded, no sandbox, no
warrant or envelope, no checkpoints (the contract carries no `attemptApi`), no codec (the default data converter),
no search attributes, one workflow task before and one after the activity. What it shares with a ksquad Run is
what any caller of that agent must do: authenticate (the same endpoint token), read the agent card once per
worker, send the message and follow the task's stream to its end.

With a sandbox (`FairTask.pool`): the same activity first takes a ready pod of a warm pool rendered from the chart's
pool template, with the least a warm claim can be (one guarded patch: warm -> bound, with the hash of the attempt's
token the pod's agent checks), sends the task to that pod's agent and deletes the pod. No Run owns the pod, no
run labels, no admission policy: the pool is in a namespace of its own (bench.sandbox_overhead).

`contract_of_a_run` reads the contract a ksquad Run's invoke_agent was given from its history, so the fair limit
sends what ksquad sent (tests/bench/test_fair_limit.py proves the agent and its model see the same call, from the
shared endpoint and from a warm sandbox)."""

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Any

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import get_message_text, new_data_part
from a2a.types import Message, Part, Role, SendMessageRequest, Task, TaskState
from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client as TemporalClient
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.agents.callers import BearerToken, CallerKeys, process_keys
from activities.agents.invocation import CONTRACT_PART, MODEL_OVERRIDE, task_text
from activities.sandboxes.manifests import ANNOTATION_TOKEN_SHA256, LABEL_STATE, pod_ready
from activities.sandboxes.warm import WarmPods
from agent.callers import read_key
from dev.stack import ENDPOINT_KEY_FILE, DevStack
from kube import ApiError, Kube, Obj, path
from workflows.activity_types import Activity, AgentInvocation
from workflows.contract import ExecutionContract

FAIR_TASK_QUEUE = "bench-fair-limit"


class FairTask(BaseModel):
    endpoint: str  # the agent's; with a pool, the pod's (its IP and the port the pod's template names)
    contract: ExecutionContract
    pool: str | None = None  # "namespace/name" of a warm pool to take the agent's pod from


@workflow.defn
class FairLimitWorkflow:
    @workflow.run
    async def run(self, task: FairTask) -> str:
        return await workflow.execute_activity_method(
            FairLimitCaller.send_task, task, start_to_close_timeout=timedelta(seconds=60)
        )


class FairLimitCaller:
    """The activity's side: one HTTP client and one agent card per endpoint, for every task of the worker."""

    def __init__(
        self, keys: CallerKeys, kube: Kube | None = None, pools: Iterable[tuple[str, str]] = ()
    ) -> None:
        """`kube` and `pools` ((namespace, name)): the warm pools it takes pods from, watched as ksquad's worker
        watches its own (activities.sandboxes.warm)."""
        self.keys = keys
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0))
        self.factory = ClientFactory(ClientConfig(streaming=True, httpx_client=self.http))
        self.cards: dict[str, Any] = {}
        self.kube = kube
        self.warm_pods = WarmPods(kube, pools) if kube is not None else None

    async def aclose(self) -> None:
        if self.warm_pods is not None:
            await self.warm_pods.close()
        await self.http.aclose()

    async def client(self, endpoint: str, contract: ExecutionContract) -> Client:
        token = BearerToken(lambda: self.keys.token(contract))
        card = self.cards.get(endpoint)
        if card is None:
            bearer = self.keys.token(contract)
            card = await A2ACardResolver(self.http, endpoint).get_agent_card(
                http_kwargs={"headers": {"Authorization": f"Bearer {bearer}"}} if bearer else None
            )
            self.cards[endpoint] = card
        return self.factory.create(card, [token])

    async def bind(self, pool: str, contract: ExecutionContract) -> Obj:
        """One ready pod of `pool`, taken with one guarded patch (409: another claimer or the kubelet changed it
        first; the next pod is tried)."""
        assert self.kube is not None and self.warm_pods is not None, "a caller for sandboxes has a Kube"
        namespace, name = pool.split("/", 1)
        self.warm_pods.start()
        for _ in range(200):  # the watch's first list, at the worker's first task
            pods = self.warm_pods.of_pool(namespace, name)
            if pods is not None:
                break
            await asyncio.sleep(0.05)
        candidates = [pod for pod in pods or [] if pod_ready(pod)]
        random.shuffle(candidates)
        for pod in candidates:
            self.warm_pods.taken(namespace, pod["metadata"]["name"])
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "labels": {LABEL_STATE: "bound"},
                    "annotations": {ANNOTATION_TOKEN_SHA256: self.keys.sandbox_token_sha256(contract.run)},
                }
            }
            try:
                return await self.kube.patch(path("v1", "pods", namespace, pod["metadata"]["name"]), patch)
            except ApiError as err:
                if err.status not in (404, 409):
                    raise
        raise ApplicationError(f"no ready pod in the warm pool {pool}", non_retryable=True)

    @activity.defn
    async def send_task(self, task: FairTask) -> str:
        if task.pool is None:
            return await self.send(task.endpoint, task.contract)
        assert self.kube is not None
        t0 = time.perf_counter()
        pod = await self.bind(task.pool, task.contract)
        bound = time.perf_counter()
        (port,) = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        endpoint = f"http://{pod['status']['podIP']}:{port}/"
        try:
            return await self.send(endpoint, task.contract)
        finally:
            answered = time.perf_counter()
            self.cards.pop(endpoint, None)  # a pod serves one task
            await self.kube.delete(path("v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"]))
            activity.logger.info(
                "pod %s: bound in %.0f ms, answered in %.0f ms, deleted in %.0f ms",
                pod["metadata"]["name"],
                (bound - t0) * 1000,
                (answered - bound) * 1000,
                (time.perf_counter() - answered) * 1000,
            )

    async def send(self, endpoint: str, contract: ExecutionContract) -> str:
        info = activity.info()
        message = Message(
            role=Role.ROLE_USER,
            message_id=f"{info.workflow_id}/{info.attempt}",
            context_id=info.workflow_id,
            parts=[Part(text=task_text(contract)), new_data_part({CONTRACT_PART: contract.for_sandbox()})],
        )
        message.metadata.update({MODEL_OVERRIDE: contract.model.model_dump(mode="json", exclude_none=True)})
        client = await self.client(endpoint, contract)
        final: Task | None = None
        answer = ""
        try:
            async for event in client.send_message(SendMessageRequest(message=message)):
                kind = event.WhichOneof("payload")
                if kind == "task":
                    final = event.task
                elif kind == "artifact_update":
                    texts = [p.text for p in event.artifact_update.artifact.parts if p.text]
                    answer = "\n".join(texts) or answer
                elif kind == "status_update":
                    update = event.status_update
                    final = Task(id=update.task_id, context_id=update.context_id, status=update.status)
        finally:
            await client.close()
        if final is None or final.status.state != TaskState.TASK_STATE_COMPLETED:
            state = TaskState.Name(final.status.state) if final is not None else "no task"
            raise ApplicationError(f"the agent's task ended {state}", non_retryable=True)
        text = get_message_text(final.status.message) if final.status.message.parts else ""
        return (answer or text)[:500]


async def contract_of_a_run(client: TemporalClient, workflow_id: str) -> tuple[FairTask, str]:
    """What a ksquad Run's first agent call was given (its contract and agent endpoint) and the answer it got
    (the invoke_agent result's summary), from the Run's history; `client` must decode the Run's payloads."""
    converter = client.data_converter
    task: FairTask | None = None
    answer: str | None = None
    scheduled: dict[int, str] = {}
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attributes.activity_type.name
            if attributes.activity_type.name == Activity.INVOKE_AGENT and task is None:
                (request,) = await converter.decode(attributes.input.payloads)
                invocation = AgentInvocation.model_validate(request)
                task = FairTask(endpoint=invocation.endpoint, contract=invocation.contract)
        elif event.HasField("activity_task_completed_event_attributes"):
            completed = event.activity_task_completed_event_attributes
            if scheduled.get(completed.scheduled_event_id) == Activity.INVOKE_AGENT and answer is None:
                (result,) = await converter.decode(completed.result.payloads)
                answer = str(result["summary"])
    if task is None or answer is None:
        raise RuntimeError(f"{workflow_id}: no completed invoke_agent in its history")
    return task, answer


def fair_task_for(template: FairTask, name: str) -> FairTask:
    """The template's task as the attempt of another run (its own uid, so its own token and task)."""
    run = template.contract.run.model_copy(update={"name": name, "uid": f"fair-{name}"})
    return template.model_copy(update={"contract": template.contract.model_copy(update={"run": run})})


def fair_limit_worker(dev: DevStack) -> contextlib.AbstractAsyncContextManager[TemporalClient]:
    """The fair limit's worker beside the embedded stack `dev`: its Temporal, its shared endpoint agents' key."""
    return fair_limit_worker_at(dev.server.target, read_key(str(dev.state_dir / ENDPOINT_KEY_FILE)))


@contextlib.asynccontextmanager
async def fair_limit_worker_at(
    target: str,
    endpoint_key: bytes | None = None,
    kube: Kube | None = None,
    pools: Iterable[tuple[str, str]] = (),
) -> AsyncIterator[TemporalClient]:
    """The fair limit's worker on the Temporal at `target`, calling shared endpoint agents with `endpoint_key` as
    ksquad's worker does (and sandboxes of `pools` through `kube`), and running its workflow unsandboxed as
    ksquad's runs its own; yields a client to start them."""
    client = await TemporalClient.connect(target, data_converter=pydantic_data_converter)
    caller = FairLimitCaller(CallerKeys(process_keys().sandbox, endpoint_key), kube, pools)
    try:
        async with Worker(
            client,
            task_queue=FAIR_TASK_QUEUE,
            workflows=[FairLimitWorkflow],
            activities=[caller.send_task],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            yield client
    finally:
        await caller.aclose()
