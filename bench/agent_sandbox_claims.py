"""agent-sandbox's own claims (kubernetes-sigs/agent-sandbox v1.0.1, testbed/agent_sandbox.py) beside ksquad's in
`bench.sandbox_claims`: on the same control plane and kwok nodes, SandboxWarmPools of SandboxTemplates whose pods
are the chart's pool pods (the same spec, placement and image; ksquad's labels left out, so neither claimer sees the
other's pods), claimed as agent-sandbox's clients claim: a SandboxClaim created, its sandbox taken once the claim's
`Ready` condition is True and `status.sandbox` names it (measured from the create request, as agent-sandbox's
`claim_startup_latency` is), held, then the claim deleted (its Sandbox and pod go through the garbage collector).

What the cluster spends on a claim, for either claimer, is read from the API server's audit log
(`ControlPlane(audit_every_write=True)`): every write in the measurement's window, by whom and to what, per claim;
Lease renewals (node heartbeats, leader election) are counted apart, as what the cluster writes anyway."""

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.stats import cpu_by_role, cpu_ms_per_run, percentiles
from kube import ApiError, Kube, path, reflect
from testbed import agent_sandbox, kwok

EXTENSIONS = "extensions.agents.x-k8s.io/v1beta1"
POOL_PREFIX = "as"  # agent-sandbox's pools: as0..as3, beside the chart's p0..p3


def templates_from_chart(docs: list[dict[str, Any]], pools: int) -> list[dict[str, Any]]:
    """SandboxTemplates and SandboxWarmPools whose pods are the chart's pool pods p0.. (ksquad's labels dropped)."""
    replica_sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ReplicaSet"}
    out: list[dict[str, Any]] = []
    for i in range(pools):
        (replica_set,) = [r for n, r in replica_sets.items() if n.endswith(f"p{i}")]
        template = replica_set["spec"]["template"]
        name = f"{POOL_PREFIX}{i}"
        out.append(
            {
                "apiVersion": EXTENSIONS,
                "kind": "SandboxTemplate",
                "metadata": {"name": name},
                "spec": {
                    "networkPolicyManagement": "Unmanaged",  # the cluster's own policy, as for ksquad's pods
                    "podTemplate": {
                        "metadata": {"labels": {"app.kubernetes.io/component": "agent-sandbox-bench"}},
                        "spec": template["spec"],
                    },
                },
            }
        )
        out.append(
            {
                "apiVersion": EXTENSIONS,
                "kind": "SandboxWarmPool",
                "metadata": {"name": name},
                "spec": {"replicas": replica_set["spec"]["replicas"], "sandboxTemplateRef": {"name": name}},
            }
        )
    return out


def ready(obj: dict[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Claims:
    """One watch of the namespace's SandboxClaims: each claim's first moment Ready with its sandbox named."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        url = path(EXTENSIONS, "sandboxclaims", self.namespace)
        self._task = asyncio.create_task(reflect(self.kube, url, self._listed, self._changed))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _listed(self, claims: list[dict[str, Any]]) -> None:
        for claim in claims:
            self._changed("ADDED", claim)

    def _changed(self, kind: str, claim: dict[str, Any]) -> None:
        waiter = self.waiting.get(claim["metadata"]["name"])
        bound = (claim.get("status") or {}).get("sandbox") or {}
        if waiter is not None and not waiter.done() and ready(claim) and bound.get("name"):
            waiter.set_result(claim)

    def expect(self, name: str) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[name] = future
        return future


async def pools_ready(admin: Kube, namespace: str, pools: int, replicas: int, within: float = 240) -> None:
    deadline = time.monotonic() + within
    while True:
        counts = []
        for i in range(pools):
            pool = await admin.get(path(EXTENSIONS, "sandboxwarmpools", namespace, f"{POOL_PREFIX}{i}"))
            counts.append(int((pool.get("status") or {}).get("readyReplicas") or 0))
        if all(c >= replicas for c in counts):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"agent-sandbox's pools never filled: ready {counts} of {replicas} each")
        await asyncio.sleep(0.5)


async def measure(
    admin: Kube, namespace: str, pools: int, rate: float, seconds: float, hold: float, prefix: str
) -> dict[str, Any]:
    """Claims at `rate` for `seconds`, open loop, each deleted `hold` seconds after it is Ready."""
    count = max(1, round(rate * seconds))
    claims = Claims(admin, namespace)
    claims.start()
    latencies: list[float] = []
    launch: Counter[str] = Counter()
    bound: list[str] = []
    errors: list[str] = []
    releases: list[asyncio.Task[None]] = []
    url = path(EXTENSIONS, "sandboxclaims", namespace)

    async def release(name: str) -> None:
        await asyncio.sleep(hold)
        try:
            await admin.delete(path(EXTENSIONS, "sandboxclaims", namespace, name), propagation="Background")
        except ApiError as err:
            errors.append(f"delete {name}: {err}")

    async def claim(i: int) -> None:
        name = f"{prefix}-{i:05d}"
        waiter = claims.expect(name)
        body = {
            "apiVersion": EXTENSIONS,
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": f"{POOL_PREFIX}{i % pools}"}},
        }
        t0 = time.perf_counter()
        try:
            await admin.create(url, body)
            done = await asyncio.wait_for(waiter, 120)
        except (ApiError, TimeoutError) as err:
            errors.append(f"{name}: {type(err).__name__}: {err}"[:300])
            return
        latencies.append((time.perf_counter() - t0) * 1000)
        sandbox = done["status"]["sandbox"]["name"]
        bound.append(sandbox)
        launch["warm" if not sandbox.startswith(prefix) else "cold"] += 1  # a cold one is named as its claim
        releases.append(asyncio.create_task(release(name)))

    roles = cpu_by_role()
    started = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(claim(i)))
    window = time.perf_counter() - started
    await asyncio.gather(*tasks)
    claimed_in = time.perf_counter() - started
    per_claim = cpu_ms_per_run(roles, cpu_by_role(), count)
    await asyncio.gather(*releases)
    await claims.close()
    return {
        "claims": count,
        "started_per_second": round(count / window, 2),
        "claim": percentiles(latencies) if latencies else None,
        "sandboxes": dict(launch),
        "cold_fallbacks": launch.get("cold", 0),
        "failed": len(errors),
        "errors": errors[:10],
        "double_binds": sum(n - 1 for n in Counter(bound).values() if n > 1),
        "seconds_to_last_claim": round(claimed_in, 2),
        "cpu_ms_per_claim_by_process": per_claim,
    }


class AuditWindow:
    """The API server's writes in `namespace` from now until `per_claim` is asked: by who and to what, over the
    claims made (each claimer's pools in a namespace of their own, so neither is charged the other's refills)."""

    def __init__(self, audit_log: Path, namespace: str) -> None:
        self.log = audit_log
        self.namespace = namespace
        found = audit_log.stat() if audit_log.exists() else None
        self.start = found.st_size if found else 0
        self.inode = found.st_ino if found else None

    def files(self) -> list[tuple[Path, int]]:
        """The log's files since the start, each with where to begin. The API server rotates its log at 100 MB
        (`audit-<time>.log` beside it, the same inode): a window that spans a rotation reads on from where it began
        in the rotated file, then every newer one, then the live one."""
        rotated = sorted(self.log.parent.glob(f"{self.log.stem}-*{self.log.suffix}"))
        chain = [*rotated, self.log]
        inodes = [p.stat().st_ino for p in chain]
        if self.inode not in inodes:
            return [(self.log, 0)]  # made after the start: all of it is the window's
        first = inodes.index(self.inode)
        return [(p, self.start if i == first else 0) for i, p in enumerate(chain) if i >= first]

    def events(self) -> Iterator[dict[str, Any]]:
        for file, start in self.files():
            with file.open("rb") as f:
                # The size read at the start may fall inside a line the API server was writing: begin after it.
                f.seek(max(start - 1, 0))
                if start and f.read(1) != b"\n":
                    f.readline()
                for line in f:
                    yield json.loads(line)

    def per_claim(self, claims: int, user_class: Callable[[str], str]) -> dict[str, Any]:
        writes: Counter[str] = Counter()
        by_user: Counter[str] = Counter()
        by_resource: Counter[str] = Counter()
        leases = conflicts = 0
        for event in self.events():
            if event.get("stage") != "ResponseComplete":
                continue
            if event.get("verb") not in ("create", "update", "patch", "delete", "deletecollection"):
                continue
            ref = event.get("objectRef") or {}
            if ref.get("namespace") != self.namespace or ref.get("resource") == "runs":
                continue  # the other claimer's, or the Runs the bench makes before the clock (no claim's)
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            if ref.get("resource") == "leases":
                leases += 1
                continue
            if (event.get("responseStatus") or {}).get("code") == 409:
                conflicts += 1
            who = user_class((event.get("user") or {}).get("username", ""))
            writes[f"{event['verb']} {resource}"] += 1
            by_user[who] += 1
            by_resource[resource] += 1
        total = sum(by_user.values())
        return {
            "writes_per_claim": round(total / claims, 2),
            "by_writer_per_claim": {k: round(v / claims, 2) for k, v in by_user.most_common()},
            "by_resource_per_claim": {k: round(v / claims, 2) for k, v in by_resource.most_common()},
            "conflicts_per_claim": round(conflicts / claims, 3),
            "lease_writes": leases,
        }


def writer(username: str) -> str:
    """Who wrote, by role: the claimer, agent-sandbox's controller, Kubernetes' controllers, the scheduler, the
    simulated kubelets (kwok), the bench's client (agent-sandbox's claims, made as its clients make them)."""
    if username.startswith("system:serviceaccount:") and username.endswith(":ksquad-worker"):
        return "ksquad-worker"
    roles = {
        agent_sandbox.USER: "agent-sandbox-controller",
        kwok.USER: "kwok",
        "ksquad-test-admin": "bench client",
    }
    if username in roles:
        return roles[username]
    for prefix, role in (
        ("system:kube-controller-manager", "kube-controller-manager"),
        ("system:serviceaccount:kube-system:", "kube-controller-manager"),
        ("system:kube-scheduler", "kube-scheduler"),
        ("system:node:", "kubelet"),
    ):
        if username.startswith(prefix):
            return role
    return username
