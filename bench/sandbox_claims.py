"""Warm sandbox claims at agent-sandbox's rates, on simulated nodes: the worker's own claim (`acquire_sandbox`'s
code, `KubernetesSandboxes.acquire`, as the chart's worker ServiceAccount) from four warm pools the chart renders,
their pods on kwok's nodes (testbed/kwok.py: scheduled by the real kube-scheduler, made by the real ReplicaSet
controller, Ready without a container), so that 2 cores refill pools at 45-75 pods a second, which they could not
do starting containers.

    python -m testbed.isolate python -m bench.sandbox_claims [--rates 45:60,75:10] [--replicas 60] [--nodes 10]

Each `rate:seconds` starts claims at that rate, evenly spaced, for that long, each one released (its pod deleted,
as after its run) `--hold` seconds after it is bound. Measured as agent-sandbox measures a claim: from the request
to a bound, Ready sandbox (bind_warm takes only Ready pods of the pool's current template and returns once its
guarded patch has bound one). Reported per rate:
- claim p50/p90/p99 (ms), over every claim that was bound warm;
- conflicts: guarded patches refused with 409 (another claimer, or a status update, changed the pod first);
- double binds: pods returned to two claims (must be 0);
- cold fallbacks: claims that found their pool empty (a Job instead: made, then released at once);
- refill: pods that became Ready in the pools per second, and the fewest Ready in a pool at once;
- CPU per claim of the claimer (the worker's code in this process), the API server, etcd, the controllers, kwok;
- API writes per claim, whoever makes them (the audit log: the claim, the refill, the release, to the pools at rest
  again), by writer and by resource;
- the same for kubernetes-sigs/agent-sandbox (v1.0.1, its controller running beside: bench.agent_sandbox_claims) at
  the same rate on the same nodes, its pools (SandboxWarmPools of SandboxTemplates running the chart's pool pods) in
  a namespace of their own, and ksquad's figures over its (`ksquad_over_agent_sandbox`: p50, p99, API writes,
  control-plane CPU, the claimer's CPU). Goal: at most 0.5 for API writes and p99 at every rate both sustain.

Beside it, whole runs through a real pod on the real node: `bench.warm_claims`, at the rates 2 cores hold.
Peer: kubernetes-sigs/agent-sandbox publishes 45 claims/s over four pools at p50 92 ms, p90 182 ms, p99 376 ms
(docs/performance-tuning.md, a 16-core control plane), and its scalability presubmit runs 75 claims/s for 10 s on
kwok (100 simulated nodes), passing at p50 and p90 <= 300 ms, p99 <= 500 ms. Targets (DESIGN.md): 45/s for 60 s
at p50 <= 50 ms and p99 <= 200 ms; 75/s for 10 s at p99 <= 500 ms; no double bind.
"""

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from activities.sandboxes import KubernetesSandboxes
from activities.sandboxes.manifests import pod_ready
from bench import agent_sandbox_claims as peer
from bench.bridge import CRDS, holding_range
from bench.stats import cpu_by_role, cpu_ms_per_run, percentiles, report
from bench.warm_claims import unready_pods
from kube import ApiError, Config, Kube, path
from testbed import agent_sandbox, chart, warrants
from testbed.chart import worker_settings
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from testbed.kwok import KWOK_TAINT, SimulatedNodes
from testbed.stack import RUN_API, apply_chart_rbac, service_account_kubeconfig
from workflows.activity_types import SandboxRelease, SandboxRequest
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import Placement, SandboxPolicy, Toleration

POOLS = 4
NAMESPACE = "claims"
PEER = {"claims_per_second": 45, "p50_ms": 92, "p90_ms": 182, "p99_ms": 376}  # agent-sandbox, published
PEER_PRESUBMIT = {"claims_per_second": 75, "seconds": 10, "p50_ms": 300, "p90_ms": 300, "p99_ms": 500}
TARGETS = {45.0: {"p50_ms": 50, "p99_ms": 200}, 75.0: {"p99_ms": 500}}
# What a pool pod asks of its (simulated) node; the chart's default would do as well, kwok's nodes are large.
POD_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
# The pools' pods go to the simulated nodes only: their label, and their taint tolerated.
PLACEMENT = Placement(
    node_selector={"type": "kwok"},
    tolerations=[
        Toleration(key=KWOK_TAINT["key"], operator="Equal", value=KWOK_TAINT["value"], effect="NoSchedule")
    ],
)
MODEL = ModelRef(name="m", url="http://model.invalid/v1")


class CountingKube(Kube):
    """The worker's client, counting the guarded patches the API server refused with 409."""

    conflicts = 0

    async def patch(self, url: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().patch(url, body, *args, **kwargs)
        except ApiError as err:
            if err.status == 409:
                self.conflicts += 1
            raise


def pool_values(replicas: int) -> dict[str, Any]:
    placement = PLACEMENT.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)
    return {
        "sandbox": {
            "image": AGENT_IMAGE,
            "resources": POD_RESOURCES,
            "allowedTolerations": [KWOK_TAINT["key"]],
        },
        "pools": [
            {"name": f"p{i}", "namespace": NAMESPACE, "replicas": replicas, "placement": placement}
            for i in range(POOLS)
        ],
    }


def chart_pools(
    plane: ControlPlane, namespace: str, values: dict[str, Any]
) -> tuple[list[dict[str, Any]], Path]:
    """The chart's RBAC and warm pools for `namespace`, rendered from `values`: the chart's documents, and a
    kubeconfig of the worker's ServiceAccount (what the claims are made as)."""
    apply_chart_rbac(plane, namespace, values)
    docs = chart.render({**values, "namespaces": [namespace]})
    plane.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all([d for d in docs if d["kind"] == "ReplicaSet"])
    )
    return docs, service_account_kubeconfig(plane, "ksquad-worker", namespace)


async def make_runs(admin: Kube, prefix: str, count: int, namespace: str = NAMESPACE) -> list[RunIdentity]:
    """The Runs the claims are for, made before the clock starts: a claimed pod is owned by its Run (a pod whose
    owner does not exist would be collected by the garbage collector, work no real claim causes). No bridge runs:
    they are objects only."""
    url = path(RUN_API, "runs", namespace)
    gate = asyncio.Semaphore(16)

    async def make(i: int) -> RunIdentity:
        name = f"{prefix}-{i:05d}"
        body = {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": name}, "spec": {"agents": ["a"]}}
        async with gate:
            for _ in range(50):  # a CRD just established: "Kind=Run not found" (503) for a moment
                try:
                    made = await admin.create(url, body)
                    break
                except ApiError as err:
                    if err.status != 503:
                        raise
                    await asyncio.sleep(0.2)
            else:
                made = await admin.create(url, body)
        return RunIdentity(namespace=namespace, name=name, uid=made["metadata"]["uid"], attempt=1, fence=1)

    return list(await asyncio.gather(*(make(i) for i in range(count))))


def claim_request(i: int, run: RunIdentity) -> SandboxRequest:
    agent = ResolvedAgent(name="claimer", model=MODEL, placement=PLACEMENT)
    contract = ExecutionContract(run=run, agent=agent, model=MODEL)
    return warrants.sandbox_request(contract, 60, policy=SandboxPolicy(pool=f"p{i % POOLS}"), run_seconds=600)


def ready_per_pool(sandboxes: KubernetesSandboxes, seen: set[str] | None = None) -> dict[str, int]:
    """Ready warm pods per pool, as the claimer's own watch has them (a list of every pool pod twice a second
    would cost this process more than its claims); adds their names to `seen`."""
    counts: dict[str, int] = {}
    for i in range(POOLS):
        pods = [p for p in sandboxes.pools.warm_pods.of_pool(NAMESPACE, f"p{i}") or [] if pod_ready(p)]
        counts[f"p{i}"] = len(pods)
        if seen is not None:
            seen.update(p["metadata"]["name"] for p in pods)
    return counts


async def pools_full(sandboxes: KubernetesSandboxes, admin: Kube, replicas: int, within: float = 180) -> None:
    sandboxes.pools.warm_pods.start()
    deadline = time.monotonic() + within
    while True:
        ready = ready_per_pool(sandboxes)
        if all(ready.get(f"p{i}", 0) >= replicas for i in range(POOLS)):
            return
        if time.monotonic() > deadline:
            unready = await unready_pods(admin, NAMESPACE)
            raise RuntimeError(
                f"pools never filled: ready {ready} of {replicas} each; {len(unready)} not ready: "
                + "; ".join(unready[:20])
            )
        await asyncio.sleep(0.5)


async def measure(
    sandboxes: KubernetesSandboxes, admin: Kube, rate: float, seconds: float, hold: float
) -> dict[str, Any]:
    count = max(1, round(rate * seconds))
    runs = await make_runs(admin, f"c{rate:g}".replace(".", "-"), count)
    latencies: list[float] = []
    bound: list[str] = []
    kinds: Counter[str] = Counter()
    errors: list[str] = []
    releases: list[asyncio.Task[None]] = []
    kube = sandboxes.kube
    assert isinstance(kube, CountingKube)
    conflicts_before = kube.conflicts

    async def release(req: SandboxRequest, sandbox: Any) -> None:
        await asyncio.sleep(hold)
        try:
            await sandboxes.release(SandboxRelease(warrant=req.warrant, sandbox=sandbox))
        except Exception as err:  # counted: the pool's pod would be left behind
            errors.append(f"release {sandbox.name}: {err}")

    async def claim(req: SandboxRequest) -> None:
        t0 = time.perf_counter()
        try:
            sandbox = await sandboxes.acquire(req)
        except Exception as err:  # a failed claim is reported, not a crash
            errors.append(f"{req.contract.run.name}: {type(err).__name__}: {err}"[:300])
            return
        took = (time.perf_counter() - t0) * 1000
        kinds[sandbox.kind] += 1
        if sandbox.kind == "warm":
            latencies.append(took)
            bound.append(sandbox.name)
        releases.append(asyncio.create_task(release(req, sandbox)))

    seen: set[str] = set()
    ready_before: set[str] = set()
    ready_per_pool(sandboxes, ready_before)
    seen |= ready_before
    fewest = {f"p{i}": 10**6 for i in range(POOLS)}
    sampling = True

    async def sample() -> None:
        while sampling:
            ready = ready_per_pool(sandboxes, seen)
            for pool in fewest:
                fewest[pool] = min(fewest[pool], ready.get(pool, 0))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    roles = cpu_by_role()
    started = time.perf_counter()
    claims = []
    for i in range(count):  # open loop: each claim starts on schedule, however long the earlier ones take
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        claims.append(asyncio.create_task(claim(claim_request(i, runs[i]))))
    window = time.perf_counter() - started
    await asyncio.gather(*claims)
    claimed_in = time.perf_counter() - started
    per_claim = cpu_ms_per_run(roles, cpu_by_role(), count)
    await asyncio.gather(*releases)
    sampling = False
    await sampler
    doubles = sum(n - 1 for n in Counter(bound).values() if n > 1)
    return {
        "claims": count,
        "started_per_second": round(count / window, 2),
        "claim": percentiles(latencies) if latencies else None,
        "sandboxes": dict(kinds),
        "cold_fallbacks": kinds.get("cold", 0),
        "failed": len(errors),
        "errors": errors[:10],
        "conflicts": kube.conflicts - conflicts_before,
        "double_binds": doubles,
        "seconds_to_last_claim": round(claimed_in, 2),
        "refilled_per_second": round(len(seen - ready_before) / claimed_in, 2),
        "fewest_ready_in_a_pool": min(fewest.values()),
        # the claimer is this process ("stack"): the worker's claim code, and the bench's own sampling
        "cpu_ms_per_claim_by_process": per_claim,
    }


def held(rate: float, doc: dict[str, Any]) -> bool:
    """Within the rate's target (a rate other than 75/s: the 45/s one), every claim warm, none failed or doubled."""
    target = TARGETS.get(rate, TARGETS[45.0])
    claim = doc.get("claim")
    return (
        claim is not None
        and all(claim[k] <= v for k, v in target.items())
        and doc["double_binds"] == 0
        and doc["failed"] == 0
        and doc["cold_fallbacks"] == 0
    )


PEER_NAMESPACE = "claims-as"  # agent-sandbox's pools and claims


async def quiet(sandboxes: KubernetesSandboxes, admin: Kube, replicas: int) -> str | None:
    """Both claimers' pools full, and no pod of either still going (the last measurement's releases): a measurement
    starts on a cluster at rest. agent-sandbox's pools not full again within their bound is a result, said (None:
    all full), and the measurement goes on from where they are."""
    await pools_full(sandboxes, admin, replicas)
    problem = None
    try:
        await peer.pools_ready(admin, PEER_NAMESPACE, POOLS, replicas)
    except RuntimeError as err:
        problem = str(err)
    for _ in range(600):
        going = [
            p
            for ns in (NAMESPACE, PEER_NAMESPACE)
            for p in (await admin.list(path("v1", "pods", ns)))["items"]
            if p["metadata"].get("deletionTimestamp")
        ]
        if not going:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(3)  # the controllers' last status writes
    return problem


# What the control plane spends on a claim, either claimer's: these processes' CPU (bench.stats roles).
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


def side_by_side(ksquad: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """ksquad's pool over agent-sandbox's, figure by figure (below 1: ksquad spends less)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    def plane_cpu(doc: dict[str, Any]) -> float:
        return float(sum(doc["cpu_ms_per_claim_by_process"].get(role, 0.0) for role in CONTROL_PLANE))

    claim, peer_claim = ksquad.get("claim") or {}, peer.get("claim") or {}
    return {
        "p50": ratio(claim.get("p50_ms"), peer_claim.get("p50_ms")),
        "p99": ratio(claim.get("p99_ms"), peer_claim.get("p99_ms")),
        "api_writes": ratio(ksquad["api"]["writes_per_claim"], peer["api"]["writes_per_claim"]),
        "control_plane_cpu": ratio(plane_cpu(ksquad), plane_cpu(peer)),
        # the claimer: ksquad's worker code (this process), agent-sandbox's controller
        "claimer_cpu": ratio(
            ksquad["cpu_ms_per_claim_by_process"].get("stack"),
            peer["cpu_ms_per_claim_by_process"].get("agent-sandbox"),
        ),
    }


async def main(rates: list[tuple[float, float]], replicas: int, nodes: int, hold: float) -> dict[str, Any]:
    plane = ControlPlane(controller_api_qps=200, audit_every_write=True)
    plane.start()
    results: dict[str, Any] = {}
    try:
        plane.add_runtime_classes()
        plane.kubectl("apply", "--server-side", "-f", str(CRDS))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
        simulated = SimulatedNodes(plane)
        simulated.start()
        for n in range(nodes):
            simulated.add(f"kwok-{n}", capacity={"pods": "250"})
        docs, worker = chart_pools(plane, NAMESPACE, pool_values(replicas))
        # agent-sandbox's pools in a namespace of their own, with the ServiceAccount the chart's pods run as
        plane.kubectl("create", "namespace", PEER_NAMESPACE)
        plane.wait_for_default_service_account(PEER_NAMESPACE)
        plane.kubectl("create", "serviceaccount", "-n", PEER_NAMESPACE, "ksquad-sandbox")
        agent_sandbox.start(plane)
        plane.kubectl(
            "apply",
            "-n",
            PEER_NAMESPACE,
            "-f",
            "-",
            input=yaml.safe_dump_all(peer.templates_from_chart(docs, POOLS)),
        )
        async with (
            Kube(Config.from_kubeconfig(plane.admin_kubeconfig)) as admin,
            CountingKube(Config.from_kubeconfig(worker)) as kube,
        ):
            sandboxes = KubernetesSandboxes(kube, worker_settings(docs))
            try:
                await pools_full(sandboxes, admin, replicas)
                for rate, seconds in rates:
                    await quiet(sandboxes, admin, replicas)
                    window = peer.AuditWindow(plane.audit_log, NAMESPACE)
                    doc = await measure(sandboxes, admin, rate, seconds, hold)
                    await quiet(sandboxes, admin, replicas)  # the writes of every refill and release counted
                    doc["api"] = window.per_claim(doc["claims"], peer.writer)
                    doc["seconds"] = seconds
                    doc["held_target"] = held(rate, doc)
                    # agent-sandbox at the same rate, on the same nodes, its pools as full
                    not_full = await quiet(sandboxes, admin, replicas)
                    window = peer.AuditWindow(plane.audit_log, PEER_NAMESPACE)
                    theirs = await peer.measure(
                        admin, PEER_NAMESPACE, POOLS, rate, seconds, hold, f"as{rate:g}".replace(".", "-")
                    )
                    theirs["pools_not_full_after"] = await quiet(sandboxes, admin, replicas)
                    theirs["api"] = window.per_claim(theirs["claims"], peer.writer)
                    theirs["pools_not_full_before"] = not_full
                    doc["agent_sandbox"] = theirs
                    doc["ksquad_over_agent_sandbox"] = side_by_side(doc, theirs)
                    results[f"{rate:g}_claims_per_second"] = doc
            finally:
                await sandboxes.close()
    finally:
        plane.stop()
    return {
        **holding_range(results, lambda doc: bool(doc["held_target"])),
        "pools": POOLS,
        "replicas_per_pool": replicas,
        "simulated_nodes": nodes,
        "hold_seconds": hold,
        "targets_ms": {f"{k:g}": v for k, v in TARGETS.items()},
        "peer_agent_sandbox": PEER,
        "peer_agent_sandbox_presubmit_kwok": PEER_PRESUBMIT,
        **results,
    }


def parse_rates(text: str) -> list[tuple[float, float]]:
    pairs = []
    for item in text.split(","):
        rate, _, seconds = item.partition(":")
        pairs.append((float(rate), float(seconds or 60)))
    return pairs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="45:60,75:10", help="rate:seconds, one measurement each")
    parser.add_argument("--replicas", type=int, default=60, help="warm pods per pool (four pools)")
    parser.add_argument("--nodes", type=int, default=10, help="simulated nodes (250 pods each)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds a claimed sandbox is held")
    args = parser.parse_args()
    report("sandbox_claims", asyncio.run(main(parse_rates(args.rates), args.replicas, args.nodes, args.hold)))
