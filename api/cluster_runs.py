"""A Run's records on ksquad-api: its events as a stream (server-sent, numbered, resumable) and its artifacts, each
read from the store only once the API server says the caller may `get` that Run; a stream ends when the Run ends,
is gone, or its reader may no longer read it. Event streams open now: the metric ksquad_api_event_streams."""

from typing import Any

from prometheus_client import Gauge
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from api.budgets import Budget, OverBudget
from api.cluster_callers import Callers, counted
from api.errors import error, too_many
from api.kubernetes_auth import Access
from api.streams import HeldStream, RunLook, parse_cursor, run_ending, stream_events
from kube import ApiError, Kube, Unreachable, path
from store import Store, StoreError

RUN_API = "ksquad.io/v1alpha1"
STREAMS = Gauge("ksquad_api_event_streams", "event streams open now")


def run_routes(store: Store, kube: Kube, callers: Callers, streams: Budget) -> list[Route]:
    """/runs/{namespace}/{name}/events and /runs/{namespace}/{name}/artifacts/{artifact}, each answer counted."""

    async def run_for(request: Request, verb: str = "get") -> tuple[dict[str, Any] | None, Response | None]:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        caller = await callers.kubernetes_user(request)
        if caller.refusal is not None:
            return None, caller.refusal
        refusal = await callers.may(caller, Access(verb, "runs", namespace=namespace, name=name))
        if refusal is not None:
            return None, refusal
        try:
            run: dict[str, Any] = await kube.get(path(RUN_API, "runs", namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None, error(404, f'run "{namespace}/{name}" not found')
            return None, error(503, f"reading run {namespace}/{name}: {err}")
        except Unreachable as err:
            return None, error(503, f"the Kubernetes API server does not answer: {err}")
        return run, None

    async def events(request: Request) -> Response:
        run, refusal = await run_for(request)
        if refusal is not None:
            return refusal
        assert run is not None
        try:
            after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
        except ValueError as err:
            return error(422, str(err))
        meta = run["metadata"]
        reader = (await callers.kubernetes_user(request, counted=False)).user
        assert reader is not None  # run_for let them in
        try:
            held = HeldStream(streams, reader.name, meta["namespace"])
        except OverBudget as err:
            return too_many(str(err), err.retry_after)
        url = path(RUN_API, "runs", meta["namespace"], meta["name"])
        may_read = Access("get", "runs", namespace=meta["namespace"], name=meta["name"])

        async def look() -> RunLook | None:
            # As the reader: their token still accepted, their rights still there (decisions are cached for
            # seconds), so a reader whose RoleBinding went stops reading within seconds.
            caller = await callers.kubernetes_user(request, counted=False)
            if caller.user is None:  # refused (401), or not reviewed now (look again later)
                assert caller.refusal is not None
                return RunLook(None, "", forbidden=True) if caller.refusal.status_code == 401 else None
            try:
                if not await callers.auth.allowed(caller.user, may_read):
                    return RunLook(None, "", forbidden=True)
            except PermissionError:
                return None  # the API server did not answer: look again later
            try:
                current = await kube.get(url)
            except ApiError as err:
                return RunLook(None, "") if err.status == 404 else None
            except Unreachable:
                return None  # look again later; the stream goes on
            return RunLook(current["metadata"]["uid"], _phase(current))

        ended = run_ending(meta["uid"], look)

        async def body() -> Any:
            STREAMS.inc()
            try:
                chunks = stream_events(store, meta["uid"], after, request.is_disconnected, ended)
                async for chunk in held.counted(chunks):
                    yield chunk
            finally:
                STREAMS.dec()

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def artifact(request: Request) -> Response:
        run, refusal = await run_for(request)
        if refusal is not None:
            return refusal
        assert run is not None
        name = request.path_params["artifact"]
        try:
            found = await store.artifact(run["metadata"]["uid"], name)
        except StoreError as err:
            return error(503, f"the store does not answer: {err}")
        if found is None:
            return error(
                404, f"run {run['metadata']['namespace']}/{run['metadata']['name']} has no artifact {name!r}"
            )
        media_type, content = found
        return Response(content, media_type=media_type or "application/octet-stream")

    return [
        Route("/runs/{namespace}/{name}/events", counted("events", events)),
        Route("/runs/{namespace}/{name}/artifacts/{artifact:path}", counted("artifact", artifact)),
    ]


def _phase(run: dict[str, Any]) -> str:
    return str((run.get("status") or {}).get("phase") or "")
