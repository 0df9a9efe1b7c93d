"""The bridge as Runs grow: ksquad deployed as the chart deploys it (bench.bridge's stack: bridge and worker as
their own processes with the chart's ServiceAccounts), with the namespace's Runs grown to each population in turn
(100, 1,000, 10,000 by default): nine in ten finished (Succeeded through the whole workflow, an already-running
agent and the scripted model), one in ten paused (its credential answered 429 with a Retry-After of two hours).

    python -m testbed.isolate python -m bench.bridge_scale [--populations 100,1000,10000] [--probe 100] [--rate 4]
        [--temporal dev|production]

At each population:
- probe: `--probe` new Runs created at `--rate` per second, watched to the end: create → status.phase and state
  change → mirrored, p50/p99 (bench.bridge's figures; targets p99 <= 500 ms);
- the bridge's resident memory, and its CPU per reconcile over the probe (its /metrics: ksquad_reconciles);
- a restart: the bridge killed and started again, the seconds until it has reconciled every Run it lists again,
  and its CPU for that per Run.
A bridge whose cost per Run watched is flat shows the same CPU per reconcile and the same latencies at every
population, and memory growing by a constant per Run.
"""

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.bridge import TERMINAL, create_at_rate, measure, remote_stack, start_plane
from bench.stats import cpu_seconds, report
from kube import Kube, path
from testbed.agents import MODEL_KEY
from testbed.embedded import TemporalKind, rss_mb
from testbed.stack import RUN_API, Stack

LIMITED_MODEL = "limited-model"
LIMITED_SECRET = "limited-model-key"
PAUSED_SHARE = 0.1
# Growing goes at the stack's own pace: a chunk of Runs is created (at most GROW_RATE a second), then waited for
# until each is finished or paused, then the next. Creating at a fixed rate outran the stack (it starts ~3 whole
# runs a second here), and a backlog of thousands of Pending Runs measures the backlog, not the population.
GROW_RATE = 12.0
GROW_CHUNK = 250
CHUNK_LABEL = "bench.ksquad.io/chunk"


async def limited_agent(stack: Stack, admin: Kube) -> list[dict[str, Any]]:
    """A second Agent on the remote agent, whose ModelEndpoint names the model that always answers 429, with a
    credential of its own: throttling is per credential, and a limit on the first Agent's would pause every Run."""
    remote = await admin.get(path(RUN_API, "agents", stack.namespace, "remote"))
    secret = await admin.get(path("v1", "secrets", stack.namespace, "model-key"))
    mounted = (
        stack.root / "remote-secrets" / stack.namespace / LIMITED_SECRET / "apiKey"
    )  # the remote agent's copy
    mounted.parent.mkdir(parents=True, exist_ok=True)
    mounted.write_text(MODEL_KEY)
    endpoint = {
        "apiVersion": RUN_API,
        "kind": "ModelEndpoint",
        "metadata": {"name": "limited"},
        "spec": {"url": stack.model.url, "model": LIMITED_MODEL},
    }
    spec = {**remote["spec"], "modelEndpointRef": "limited", "credentialSecretRef": {"name": LIMITED_SECRET}}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": LIMITED_SECRET,
                **{k: secret["metadata"][k] for k in ("labels", "annotations")},
            },
            "stringData": {"apiKey": MODEL_KEY},
        },
        endpoint,
        {"apiVersion": RUN_API, "kind": "Agent", "metadata": {"name": "remote-limited"}, "spec": spec},
    ]


async def reconciles(stack: Stack) -> float:
    """The bridge's reconciler passes so far, every result."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{stack.ports['bridge']}/metrics", timeout=5)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ksquad_reconciles_total{")
    )


async def settled(admin: Kube, url: str, labels: str, within: float) -> Counter[str]:
    """Wait until every Run `labels` selects is finished or paused; their phases."""
    deadline = time.monotonic() + within
    while True:
        items = (await admin.list(url, labels=labels))["items"]
        phases = Counter((r.get("status") or {}).get("phase", "") for r in items)
        if all(phase in TERMINAL or phase == "Paused" for phase in phases.elements()):
            return phases
        if time.monotonic() > deadline:
            raise RuntimeError(f"Runs ({labels}) not settled within {within:.0f}s: {dict(phases)}")
        await asyncio.sleep(2.0)


async def grow(stack: Stack, admin: Kube, population: int) -> dict[str, Any]:
    url = path(RUN_API, "runs", stack.namespace)
    present = len((await admin.list(url, metadata_only=True))["items"] or [])
    t0 = time.perf_counter()
    phases: Counter[str] = Counter()
    for start in range(present, population, GROW_CHUNK):
        chunk = f"{population}-{start}"
        bodies = {}
        for i in range(start, min(population, start + GROW_CHUNK)):
            agent = "remote-limited" if i % round(1 / PAUSED_SHARE) == 0 else "remote"
            bodies[f"bg-{i:05d}"] = {
                "metadata": {"labels": {CHUNK_LABEL: chunk}},
                "spec": {"agents": [agent]},
            }
        await create_at_rate(admin, url, bodies, GROW_RATE, time.perf_counter)
        phases += await settled(admin, url, f"{CHUNK_LABEL}={chunk}", within=600)
        print(f"bridge_scale: {start + len(bodies)} of {population} Runs", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    created = population - present
    return {
        "created": created,
        "seconds": round(seconds, 1),
        "runs_per_second": round(created / seconds, 2) if created else None,
        "phases": dict(phases),
    }


async def restart(stack: Stack, admin: Kube) -> dict[str, Any]:
    """The bridge killed and started again: how long until it has reconciled every Run it lists."""
    url = path(RUN_API, "runs", stack.namespace)
    runs = len((await admin.list(url, metadata_only=True))["items"] or [])
    stack.kill("bridge")
    t0 = time.perf_counter()
    await stack.start("bridge")
    pid = stack.processes["bridge"].pid
    while await reconciles(stack) < runs:
        if time.perf_counter() - t0 > 600 + runs:
            raise RuntimeError(
                f"the bridge reconciled {await reconciles(stack)} of {runs} Runs after restart"
            )
        await asyncio.sleep(0.5)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds(pid)
    return {
        "runs": runs,
        "seconds_to_reconcile_all": round(seconds, 1),
        "cpu_ms_per_run": round(cpu * 1000 / runs, 2),
        "rss_mb_after": round(rss_mb(pid), 1),
    }


async def at_population(
    stack: Stack, admin: Kube, population: int, probe: int, rate: float
) -> dict[str, Any]:
    grown = await grow(stack, admin, population)
    pid = stack.processes["bridge"].pid
    cpu_before, passes_before = cpu_seconds(pid), await reconciles(stack)
    probed = await measure(stack, admin, f"probe{population}", probe, rate)
    passes = await reconciles(stack) - passes_before
    cpu = cpu_seconds(pid) - cpu_before
    return {
        "grown": grown,
        "bridge_rss_mb": round(rss_mb(pid), 1),
        "probe": probed,
        "bridge_cpu_ms_per_reconcile": round(cpu * 1000 / max(1.0, passes), 2),
        "reconciles_during_probe": passes,
        "restart": await restart(stack, admin),
    }


async def main(populations: list[int], probe: int, rate: float, temporal: TemporalKind) -> dict[str, Any]:
    plane, state = start_plane()
    state.load(
        {"models": {"dev-model": [{"text": "done"}], LIMITED_MODEL: [{"error": 429, "retry_after": "7200"}]}}
    )
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with remote_stack(plane, state, temporal, Path(tmp)) as (stack, admin):
                stack.apply(*await limited_agent(stack, admin))
                for population in sorted(populations):
                    results[f"{population}_runs"] = await at_population(stack, admin, population, probe, rate)
    finally:
        plane.stop()
    return {
        "temporal": temporal,
        "paused_share": PAUSED_SHARE,
        "probe_runs": probe,
        "probe_rate": rate,
        "targets_ms": {"create_to_phase": {"p50": 100, "p99": 500}, "state_change_to_mirrored": {"p99": 500}},
        **results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--populations", default="100,1000,10000", help="Runs in the namespace, one measurement each"
    )
    parser.add_argument("--probe", type=int, default=100, help="Runs created and measured at each population")
    parser.add_argument("--rate", type=float, default=4.0, help="the probe's creations per second")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    pops = [int(p) for p in args.populations.split(",")]
    report("bridge_scale", asyncio.run(main(pops, args.probe, args.rate, args.temporal)))
