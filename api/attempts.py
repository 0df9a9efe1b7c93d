"""What an attempt's agent reaches of ksquad besides its work item, with the attempt's token (agent.callers'
item token, made by the worker for every attempt; the same routes on the cluster's API, where sandboxes reach them
on the listener for sandboxes, and the embedded one):

    GET  /attempts/checkpoints   the Run's recorded steps, every attempt's, oldest first:
                                 {"steps": [{"attempt", "step", "kind", "data", "at"}]}
    POST /attempts/checkpoints   {"steps": [{"step", "kind", "data"}]}: this attempt's next steps, all or none

Both answer 409 once the attempt's fence has moved (a later attempt, a cancel, a timeout): an agent asks one of
them before each model call (agent.journal), so an attempt fenced off stops before it spends another token, whether
or not its cancel reached it. 413 names the bound a step or the Run passed (store.checkpoints), 422 the field a
step got wrong, 503 when the store does not answer.

A step's data is sealed with the codec's key ring (temporal_client.codec) before it is stored, with the Run's uid
inside, so the database holds ciphertext and a step copied to another Run's rows is refused when read.
"""

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payload

from agent.callers import ItemAccess
from api.errors import error
from api.items import attempt_token, json_body
from store import CheckpointRefused, Holder, StaleFence, Step, Store, StoreError, work_item_key
from store.checkpoints import MAX_STEP_BYTES, STEP_KINDS
from temporal_client.codec import UNREADABLE, EncryptionCodec

PREFIX = "/attempts/"
MAX_WRITE_BYTES = 4 * MAX_STEP_BYTES  # one write's body: a few steps at their largest
JSON_PLAIN = b"json/plain"


class Unsealable(Exception):
    """A stored step this API cannot read back (another key, altered, or another Run's)."""


async def seal(codec: EncryptionCodec | None, run_uid: str, body: dict[str, Any]) -> tuple[bytes, int]:
    """The step as stored (a Payload, encrypted when a codec is configured) and its length in clear."""
    clear = json.dumps({"run": run_uid, **body}, separators=(",", ":")).encode()
    payload = Payload(metadata={"encoding": JSON_PLAIN}, data=clear)
    if codec is not None:
        (payload,) = await codec.encode([payload])
    return payload.SerializeToString(), len(clear)


async def unseal(codec: EncryptionCodec | None, run_uid: str, stored: bytes) -> dict[str, Any]:
    payload = Payload.FromString(stored)
    if codec is not None:
        (payload,) = await codec.decode([payload])
    if UNREADABLE in payload.metadata:
        raise Unsealable(payload.metadata[UNREADABLE].decode(errors="replace"))
    # A step marked IN_CLEAR was stored before a codec was configured: ours all the same.
    body: dict[str, Any] = json.loads(payload.data)
    if body.pop("run", None) != run_uid:
        raise Unsealable("a step of another Run")
    return body


def attempt_routes(
    store: Store,
    key: bytes | None,
    codec: EncryptionCodec | None,
    over_rate: Callable[..., Response | None] | None = None,
) -> list[Route]:
    """The routes above. `key` checks the attempts' tokens (the item token key; None: every token is refused);
    `over_rate` counts an attempt's requests as its Run's, as the item routes do."""

    def attempt_of(request: Request) -> ItemAccess | Response:
        access = attempt_token(request, key)
        if access is None:
            return error(401, "send Authorization: Bearer <the attempt's token from its contract>")
        if isinstance(access, Response):
            return access
        refusal = over_rate(person=access.run, namespace=access.namespace, total="") if over_rate else None
        return refusal or access

    def fenced(access: ItemAccess) -> tuple[Holder, str | None]:
        holder = Holder(uid=access.uid, run=access.run, triggered_by=None)
        return holder, work_item_key(access.namespace, access.item) if access.item else None

    def superseded(access: ItemAccess, err: StaleFence) -> Response:
        return error(
            409,
            f"{access.run} attempt {access.attempt} (fence {access.fence}) is no longer current: it may not act "
            f"for the Run ({err})",
        )

    async def read(request: Request) -> Response:
        access = attempt_of(request)
        if isinstance(access, Response):
            return access
        holder, ref = fenced(access)
        try:
            if not await store.fence_is_current(holder, access.fence, ref):
                return superseded(access, StaleFence("fenced off"))
            stored = await store.checkpoints(access.uid)
        except StoreError as err:
            return error(503, f"the store does not answer: {err}")
        steps = []
        for step in stored:
            try:
                body = await unseal(codec, access.uid, step.payload)
            except (Unsealable, ValueError) as err:
                return error(503, f"step {step.step} of attempt {step.attempt} cannot be read back: {err}")
            steps.append(
                {
                    "attempt": step.attempt,
                    "step": step.step,
                    "kind": step.kind,
                    "data": body.get("data"),
                    "at": step.at.isoformat() if step.at else None,
                }
            )
        return JSONResponse({"steps": steps})

    async def record(request: Request) -> Response:
        access = attempt_of(request)
        if isinstance(access, Response):
            return access
        body = await json_body(request, MAX_WRITE_BYTES)
        if isinstance(body, Response):
            return body
        if not isinstance(body, dict) or set(body) != {"steps"} or not isinstance(body["steps"], list):
            return error(400, 'send {"steps": [{"step", "kind", "data"}, ...]}')
        steps = []
        for index, given in enumerate(body["steps"]):
            where = f"steps[{index}]"
            if not isinstance(given, dict) or set(given) != {"step", "kind", "data"}:
                return error(422, f"{where}: a step is {{step, kind, data}}", [f"{where}: step, kind, data"])
            if not isinstance(given["step"], int) or isinstance(given["step"], bool) or given["step"] < 1:
                return error(422, f"{where}.step: a number from 1", [f"{where}.step: a number from 1"])
            if given["kind"] not in STEP_KINDS:
                problem = f"{where}.kind: one of {', '.join(STEP_KINDS)}"
                return error(422, problem, [problem])
            payload, size = await seal(codec, access.uid, {"kind": given["kind"], "data": given["data"]})
            if size > MAX_STEP_BYTES:
                return error(413, f"{where}: {size} bytes, more than the {MAX_STEP_BYTES} a step may hold")
            steps.append(Step(step=given["step"], kind=given["kind"], payload=payload, size=size))
        holder, ref = fenced(access)
        try:
            await store.add_checkpoints(holder, access.attempt, access.fence, ref, steps)
        except StaleFence as err:
            return superseded(access, err)
        except CheckpointRefused as err:
            status = 413 if err.field == "data" else 422
            return error(status, str(err), [str(err)])
        except StoreError as err:
            return error(503, f"the store does not answer: {err}")
        return JSONResponse({"recorded": len(steps)}, status_code=201)

    return [
        Route(f"{PREFIX}checkpoints", read, methods=["GET"]),
        Route(f"{PREFIX}checkpoints", record, methods=["POST"]),
    ]
