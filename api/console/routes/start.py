"""Starting a run: the form (a namespace's Agents and Teams, or why the person may not), and the Run it creates
as the signed-in person; a refused one shows the form again, as filled, with the reason."""

import re
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from api.console.backend import Refused
from api.console.guard import NAME, Session
from api.console.pages import start as pages
from api.console.pages.layout import url
from api.console.routes.context import Console, shell

INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")


def parse_inputs(text: str) -> dict[str, str]:
    """`name=value` lines (blank lines skipped); Refused (422) naming the line that is not."""
    inputs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not INPUT_NAME.match(name):
            raise Refused(
                422,
                f"inputs, line {number}: write name=value, the name of letters, digits, '_', '-' or '.' "
                f"(got {line[:80]!r})",
                [f"spec.inputs: line {number}"],
            )
        inputs[name] = value.strip()
    return inputs


async def start_form(
    console: Console,
    request: Request,
    session: Session,
    values: dict[str, str] | None = None,
    problem: str = "",
) -> Response:
    backend = session.backend
    namespaces = await backend.namespaces()
    namespace = (
        (values or {}).get("namespace")
        or request.query_params.get("namespace")
        or (namespaces[0] if len(namespaces) == 1 else "")
    )
    agents: list[str] = []
    teams: list[str] = []
    refusal = None
    if namespace:
        refusal = await backend.may("create", "runs", namespace)
        agents = sorted(str(a["metadata"]["name"]) for a in await backend.objects("agents", namespace))
        teams = sorted(str(t["metadata"]["name"]) for t in await backend.objects("teams", namespace))
    body = pages.start_page(
        namespace, namespaces, agents, teams, console.csrf(session), values or {}, refusal
    )
    return shell(session, "Start a run", body, request, problem)


async def start_page(console: Console, request: Request, session: Session) -> Response:
    return await start_form(console, request, session)


async def start(console: Console, request: Request, session: Session, form: dict[str, str]) -> Response:
    namespace = form.get("namespace", "")
    kind, _, target = form.get("target", "").partition(":")
    try:
        if not NAME.match(namespace):
            raise Refused(422, f"namespace {namespace!r} is not a namespace name", ["metadata.namespace"])
        if kind not in ("agent", "team") or not target:
            raise Refused(422, "choose an Agent or a Team to start the run with", ["spec.agents"])
        name = form.get("name", "").strip() or f"{target}-{secrets.token_hex(3)}"[:63]
        if not NAME.match(name):
            raise Refused(
                422,
                f"run name {name!r}: lower-case letters, digits, '-' and '.', starting and ending with a "
                "letter or digit",
                ["metadata.name"],
            )
        spec: dict[str, Any] = {"agents": [target]} if kind == "agent" else {"teamRef": target}
        inputs = parse_inputs(form.get("inputs", ""))
        if inputs:
            spec["inputs"] = inputs
        if form.get("workItemRef", "").strip():
            spec["workItemRef"] = form["workItemRef"].strip()
        manifest = {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        await session.backend.create_run(manifest)
    except Refused as err:
        detail = f"{err.message}" + (f" ({'; '.join(err.problems)})" if err.problems else "")
        return await start_form(console, request, session, form, problem=detail)
    return RedirectResponse(url("runs", namespace, name, done="created"), status_code=303)
