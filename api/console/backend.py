"""What the console asks of the stack it is served by, for one signed-in person: the embedded stack's (dev.console:
the developer, who may do anything) or a cluster's (api.console.cluster: every read and action made with the
person's own Kubernetes credential, so the API server filters and authorises it as that user)."""

from dataclasses import dataclass
from typing import Any, Protocol

from store import Author, Store
from workflows.signals import RunSignal

Obj = dict[str, Any]


class Refused(Exception):
    """The stack said no: an HTTP status and the reason, shown on the page as it is."""

    def __init__(self, status: int, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: the name the cluster knows them by (or the developer's, embedded), and how they signed
    in (shown on every page)."""

    name: str
    how: str


class Backend(Protocol):
    viewer: Viewer
    store: Store

    async def namespaces(self) -> list[str]:
        """The namespaces to offer; empty when they cannot be listed (the person names one)."""
        ...

    async def runs(self, namespace: str | None) -> list[Obj]:
        """The Runs of `namespace` (every namespace the person may list, when None), as the API server has them."""
        ...

    async def runs_version(self, namespace: str | None) -> str:
        """What moves when a Run `runs(namespace)` returns changes, read cheaply and often (a tab asks every few
        seconds, and fetches its table only when it moved); Refused when the person may not list them."""
        ...

    async def run(self, namespace: str, name: str) -> Obj: ...

    async def objects(self, plural: str, namespace: str) -> list[Obj]:
        """Agents, Teams or Projects (`agents`, `teams`, `projects`) of the namespace: for starting a Run, and the
        squads whose memory the console shows."""
        ...

    async def create_run(self, manifest: Obj) -> Obj:
        """Create the Run as the signed-in person: it carries their identity as a kubectl-created one does."""
        ...

    async def signal(self, namespace: str, name: str, action: RunSignal, text: str) -> None:
        """Cancel, pause, resume, or answer (`text`: the answer, or the reason)."""
        ...

    async def may(self, verb: str, resource: str, namespace: str, name: str = "") -> str | None:
        """None when the person may `verb` the resource (group ksquad.io; `teams/memory`: a subresource), else why
        not, in a sentence."""
        ...

    def author(self) -> Author:
        """Who a comment is written as."""
        ...

    def temporal_url(self, workflow_id: str) -> str | None:
        """The workflow's page in the Temporal UI, when one is known."""
        ...
