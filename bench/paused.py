"""Paused scale: N Runs paused on one rate-limited credential at once, on the embedded stack with one
`ksquad-worker` process.

The first Run's model call answers 429 with Retry-After; its credential is throttled until then, and every
other Run on that credential pauses without calling (the CredentialThrottle workflow tells them). Measured:
- time to get all N paused (they are created in chunks, as fast as the stack takes them);
- worker and dev-server memory (RSS) while they are paused, sampled every second;
- model calls during the pause (must be 0: nothing hammers a rate-limited provider);
- resume lateness: when each run left Paused (the workflow's clock) minus its own resumeAt (its place in the
  credential's release ramp: runs leave a limit `resumePerSecond` apart, not all at once), p99 and max;
- time to drain: from the limit's end until the last run Succeeded.

    python -m bench.paused [--runs 10000] [--credentials 1] [--retry-after auto] [--resume-per-second auto]
                           [--temporal dev|production]

With `--credentials N` the runs are spread over N credentials (a credential is throttled per namespace and Secret:
N namespaces, each with the Agent, its ModelEndpoint and a model of its own whose first call answers 429), each
credential's first run limited before the others are created, the ramp shared among them. The moonshot of issue
49, 100,000 paused Runs over 100 credentials, is more than this machine holds (pausing 10,000 takes it ~15 min and
Retry-After is capped at an hour): `projected` scales what the measured runs cost to `--project` runs (PostgreSQL
disk and the CPU to pause and drain them linearly, the worker's memory as measured, since its workflow cache bounds
it), and says so.

Memory is the resident set of each process by role (the worker; Temporal: the dev server, or the production
server and, apart, its PostgreSQL), sampled every POLL_SECONDS while the runs are paused and, apart, while they
drain.

A first chunk of runs (no limit) measures how fast this machine completes runs. `--retry-after auto` sizes
the pause from it, so every run is paused before the limit ends (capped at 1 h by the Run workflow);
`--resume-per-second auto` sets the ModelEndpoint's ramp to 60% of it (RAMP_SHARE): what one worker drains for an hour
with room (a short probe flatters the machine: at 10,000 runs 85% of it fell behind after 35 minutes, 58% held
for the whole 48-minute drain, both on 2 cores).
"""

import argparse
import asyncio
import itertools
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import cpu_by_role, cpu_ms_per_run, database_disk_mb, percentiles, pids_by_role, report
from dev.embedded import LOCAL_CREDENTIAL_SECRET
from dev.stack import DevStack
from testbed.embedded import (
    AGENT,
    NAMESPACE,
    TemporalKind,
    bench_stack,
    rss_mb,
    run_docs,
    start_workers,
    stop_workers,
    until,
)

LIMITED = "limited"
CHUNK = 250
# Each look reads every Run (10,000 at full scale): every 0.5 s that took most of a core from the stack being
# measured. The figures do not depend on it (times come from each run's own phase events).
POLL_SECONDS = 2.0
RAMP_SHARE = 0.6


def credential_namespaces(credentials: int) -> list[str]:
    """One namespace per credential (a credential is throttled per namespace and Secret): the stack's own for one."""
    return [NAMESPACE] if credentials == 1 else [f"{NAMESPACE}-c{i:03d}" for i in range(credentials)]


def limited_model(namespaces: list[str], namespace: str) -> str:
    """The scripted model a namespace's runs call: one each, so each credential's first call answers 429."""
    return LIMITED if len(namespaces) == 1 else f"{LIMITED}-{namespaces.index(namespace)}"


def limited_docs(
    prefix: str, count: int, start: int = 0, namespaces: tuple[str, ...] | list[str] = (NAMESPACE,)
) -> list[dict[str, Any]]:
    """Runs `prefix`-<start>... on the limited models, dealt round-robin over `namespaces`."""
    docs = run_docs(prefix, count, start)
    for i, doc in enumerate(docs, start):
        namespace = namespaces[i % len(namespaces)]
        doc["metadata"]["namespace"] = namespace
        doc["spec"]["model"] = limited_model(list(namespaces), namespace)
    return docs


async def phases(dev: DevStack, namespaces: list[str] | None = None) -> dict[str, str]:
    """`namespace/name` -> phase of every Run in `namespaces` (the stack's own by default)."""
    found: dict[str, str] = {}
    for namespace in namespaces or [NAMESPACE]:
        for r in await dev.runs.objects.of_kind("Run", namespace):
            found[f"{namespace}/{r.name}"] = (r.status or {}).get("phase", "")
    return found


async def main(
    runs: int,
    retry_after: str,
    resume_per_second: str,
    temporal: TemporalKind = "dev",
    credentials: int = 1,
    project: int | None = None,
) -> dict[str, Any]:
    namespaces = credential_namespaces(credentials)
    with tempfile.TemporaryDirectory() as tmp:
        seconds = 3600 if retry_after == "auto" else int(retry_after)
        script: dict[str, list[dict[str, Any]]] = {
            limited_model(namespaces, ns): [{"error": 429, "retry_after": str(seconds)}, {"text": "ok"}]
            for ns in namespaces
        }
        async with bench_stack(Path(tmp), script, serve_worker=False, temporal=temporal) as (dev, _agent):
            assert dev.scripted is not None
            [worker] = await start_workers(dev, 1)
            try:
                measured = await measure(dev, runs, retry_after, resume_per_second, namespaces)
            finally:
                stop_workers([worker])
    return {
        **measured,
        "temporal": temporal,
        **({"projected": projected(measured, project)} if project else {}),
    }


def projected(measured: dict[str, Any], runs: int) -> dict[str, Any]:
    """What `runs` paused runs would cost, scaled from the measured ones (see the module's doc)."""
    scale = runs / measured["runs"]
    pausing = measured["cpu_ms_per_run"]["pausing"]
    draining = measured["cpu_ms_per_run"]["draining"]
    return {
        "runs": runs,
        "how": f"measured at {measured['runs']} runs over {measured['credentials']} credentials, scaled linearly "
        "(disk, CPU, time to drain at the same ramp); the worker's memory as measured, bounded by its workflow cache",
        "database_disk_gb": {
            role: round(kb * runs / 1024 / 1024, 1)
            for role, kb in measured["database_disk_kb_per_paused_run"].items()
        },
        "cpu_hours_to_pause": {role: round(ms * runs / 3.6e6, 2) for role, ms in pausing.items()},
        "cpu_hours_to_drain": {role: round(ms * runs / 3.6e6, 2) for role, ms in draining.items()},
        "hours_to_drain": round(measured["seconds_to_drain"] * scale / 3600, 1),
        "worker_rss_mb": (measured["rss_mb_while_paused"].get("worker") or {}).get("max"),
    }


def sample_rss(into: dict[str, list[float]]) -> None:
    """One sample of the resident memory (MB) of each role's processes, summed."""
    for role, pids in pids_by_role().items():
        if role in ("worker", "temporal", "postgresql"):
            total = 0.0
            for pid in pids:
                try:
                    total += rss_mb(pid)
                except OSError:  # a backend that ended meanwhile
                    continue
            into.setdefault(role, []).append(round(total, 1))


async def measure(
    dev: DevStack, runs: int, retry_after: str, resume_per_second: str, namespaces: list[str]
) -> dict[str, Any]:
    assert dev.scripted is not None
    t0 = time.perf_counter()
    probe = run_docs("probe", min(CHUNK, runs))  # before any 429: how fast this machine completes runs
    await dev.runs.apply(probe)

    async def probed() -> bool:
        return sum(p == "Succeeded" for p in (await phases(dev)).values()) == len(probe)

    await until(probed, "the probe runs")
    per_run = (time.perf_counter() - t0) / len(probe)
    # At scale pausing costs about a whole run's work: leave 30% and 2 min of margin.
    if retry_after == "auto":
        seconds = min(3600, int(per_run * runs * 1.3) + 120)
        for steps in dev.scripted.script.values():
            if steps and steps[0].get("error") == 429:
                steps[0]["retry_after"] = str(seconds)
    rate = round(RAMP_SHARE / per_run, 2) if resume_per_second == "auto" else float(resume_per_second)
    each = round(rate / len(namespaces), 3)  # the credentials share the ramp
    (agent,) = [a for a in await dev.runs.objects.of_kind("Agent", NAMESPACE) if a.name == AGENT]
    # the shared agent's credentials, mounted per namespace (testbed.embedded)
    mounted = dev.state_dir / "agent-secrets"
    for namespace in namespaces:
        if namespace != NAMESPACE:
            shutil.copytree(mounted / NAMESPACE, mounted / namespace)
    await dev.runs.apply(
        [
            *(
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Agent",
                    "metadata": {"name": AGENT, "namespace": namespace},
                    "spec": agent.spec,
                }
                for namespace in namespaces
                if namespace != NAMESPACE
            ),
            *(
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "ModelEndpoint",
                    "metadata": {"name": "local", "namespace": namespace},
                    "spec": {
                        "url": dev.model_url,
                        "credentialSecretRef": {"name": LOCAL_CREDENTIAL_SECRET},
                        "resumePerSecond": each,
                    },
                }
                for namespace in namespaces
            ),
        ]
    )
    firsts = limited_docs("p", len(namespaces), 0, namespaces)  # each credential's first run meets its limit
    await dev.runs.apply(firsts)
    first_keys = [f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in firsts]

    async def firsts_paused() -> bool:
        current = await phases(dev, namespaces)
        return all(current.get(key) == "Paused" for key in first_keys)

    await until(firsts_paused, "each credential's first run to pause", within=120 + len(namespaces))
    resume_ats = []
    for doc in firsts:
        first = await dev.runs.get(doc["metadata"]["namespace"], doc["metadata"]["name"])
        status = first.status or {}
        if not status.get("resumeAt"):
            raise RuntimeError(f"{first.namespace}/{first.name} paused with no resumeAt: {status}")
        resume_ats.append(datetime.fromisoformat(str(status["resumeAt"])))
    resume_at = min(resume_ats)  # the first limit to end: no call may come before it
    calls_before = len(dev.scripted.calls)
    disk_before, cpu_before = database_disk_mb(), cpu_by_role()
    created = time.perf_counter()
    for start in range(len(namespaces), runs, CHUNK):
        await dev.runs.apply(limited_docs("p", min(CHUNK, runs - start), start, namespaces))
    rss: dict[str, list[float]] = {}
    rss_draining: dict[str, list[float]] = {}
    paused_all_at = None
    disk_paused: dict[str, float] = {}
    cpu_paused: dict[str, float] = {}

    def ours(current: dict[str, str]) -> dict[str, str]:
        return {key: phase for key, phase in current.items() if key.split("/", 1)[1].startswith("p-")}

    while True:
        mine = ours(await phases(dev, namespaces))
        sample_rss(rss)
        counts = Counter(mine.values())
        if paused_all_at is None and counts.get("Paused") == runs:
            paused_all_at = time.perf_counter()
            disk_paused, cpu_paused = database_disk_mb(), cpu_by_role()
        if int(time.perf_counter() - created) % 30 < POLL_SECONDS:
            print(f"{time.perf_counter() - created:6.0f}s {dict(counts)}", file=sys.stderr, flush=True)
        if datetime.now(UTC) >= resume_at:
            break
        await asyncio.sleep(POLL_SECONDS)
    calls_during_pause = [c for c in dev.scripted.calls[calls_before:] if c.at < resume_at.timestamp()]
    cpu_resumed = cpu_by_role()
    drain_deadline = time.perf_counter() + runs / rate * 1.5 + 600
    while True:
        mine = ours(await phases(dev, namespaces))
        if sum(p == "Succeeded" for p in mine.values()) == runs or time.perf_counter() > drain_deadline:
            break
        if int(time.perf_counter() - created) % 30 < POLL_SECONDS:
            print(
                f"{time.perf_counter() - created:6.0f}s {dict(Counter(mine.values()))}",
                file=sys.stderr,
                flush=True,
            )
        sample_rss(rss_draining)
        await asyncio.sleep(POLL_SECONDS)
    drained = datetime.now(UTC)
    disk_drained, cpu_drained = database_disk_mb(), cpu_by_role()
    lateness, last_done = await resume_lateness(dev, namespaces)
    paused_runs = runs - len(namespaces)  # the first of each credential met its limit; the others came after
    pausing = cpu_ms_per_run(cpu_before, cpu_paused, paused_runs) if paused_all_at else {}
    draining = cpu_ms_per_run(cpu_resumed, cpu_drained, runs)
    grown = (
        {k: round(v - disk_before.get(k, 0.0), 1) for k, v in disk_paused.items()} if paused_all_at else {}
    )
    return {
        "runs": runs,
        "credentials": len(namespaces),
        "retry_after_seconds": dev.scripted.script[limited_model(namespaces, namespaces[0])][0][
            "retry_after"
        ],
        "probe_runs_per_second": round(1 / per_run, 2),
        "resume_per_second": rate,
        "resume_per_second_each_credential": each,
        "limits_end_spread_s": round((max(resume_ats) - resume_at).total_seconds(), 1),
        "seconds_to_pause_all": round(paused_all_at - created, 1) if paused_all_at else None,
        "all_paused_before_resume_at": paused_all_at is not None,
        "rss_mb_while_paused": {k: {"max": max(v), "last": v[-1]} for k, v in rss.items() if v},
        "rss_mb_while_draining": {k: {"max": max(v), "last": v[-1]} for k, v in rss_draining.items() if v},
        "model_calls_during_pause": len(calls_during_pause),
        # CPU by process role to create and pause the runs, while they wait, and to resume and finish them
        "cpu_ms_per_run": {
            "pausing": pausing,
            "while_paused_total_s": {k: round(v - cpu_paused.get(k, 0.0), 1) for k, v in cpu_resumed.items()}
            if paused_all_at
            else {},
            "draining": draining,
        },
        "database_disk_mb": {
            "before": disk_before,
            "all_paused": disk_paused if paused_all_at else {},
            "drained": disk_drained,
        },
        "database_disk_kb_per_paused_run": {k: round(v * 1024 / paused_runs, 2) for k, v in grown.items()},
        "resume_lateness": percentiles(lateness) if lateness else None,
        "seconds_to_drain": round(((last_done or drained) - resume_at).total_seconds(), 1),
        "phases": dict(Counter(mine.values())),
        "targets": {"model_calls_during_pause": 0, "resume_lateness_p99_ms": 500, "worker_rss_mb": 200},
    }


async def resume_lateness(dev: DevStack, namespaces: list[str]) -> tuple[list[float], datetime | None]:
    """Per run: when it left Paused minus the resumeAt it was paused until (ms); and the last Succeeded time."""
    lateness, last_done = [], None
    runs = [run for namespace in namespaces for run in await dev.runs.objects.of_kind("Run", namespace)]
    for run in runs:
        if not run.name.startswith("p-"):
            continue
        events = [e.data for e in await dev.store.events(run.uid) if e.kind == "phase"]
        for paused, after in itertools.pairwise(events):
            # Paused -> Paused is the run learning its place in the ramp (or a later limit): not a resume.
            if (
                paused["phase"] == "Paused"
                and paused.get("resumeAt")
                and after["phase"] not in ("Paused", "Cancelled")
            ):
                left = datetime.fromisoformat(after["at"])
                lateness.append((left - datetime.fromisoformat(paused["resumeAt"])).total_seconds() * 1000)
        done = [datetime.fromisoformat(e["at"]) for e in events if e["phase"] == "Succeeded"]
        if done and (last_done is None or done[-1] > last_done):
            last_done = done[-1]
    return lateness, last_done


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--retry-after", default="auto", help="seconds, or auto")
    parser.add_argument("--resume-per-second", default="auto", help="the ModelEndpoint's ramp, or auto")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    parser.add_argument("--credentials", type=int, default=1, help="credentials the runs are spread over")
    parser.add_argument("--project", type=int, help="also scale the costs measured to this many runs")
    args = parser.parse_args()
    report(
        "paused",
        asyncio.run(
            main(
                args.runs,
                args.retry_after,
                args.resume_per_second,
                args.temporal,
                args.credentials,
                args.project,
            )
        ),
    )
