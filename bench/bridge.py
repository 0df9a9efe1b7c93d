"""The bridge's latencies on the local control plane, ksquad deployed as the chart deploys it (bridge and worker
as their own processes, with the chart's ServiceAccounts), over N runs at each creation rate:
- create → phase: from the API request that creates a Run (what `kubectl apply` sends) until a watcher sees
  `status.phase` set (the bridge saw the Run, added its finalizer, started its workflow and acknowledged it);
- mirror: from a workflow state change (`status.lastTransitionTime`, the workflow's clock) until a watcher sees
  that revision on the Run.

    python -m bench.bridge [--runs N] [--rates 2,4,8,12] [--temporal dev|production]

Status under load: `holds_at_most` is the highest rate whose create → phase and mirror p99 are both within
500 ms (STATUS_P99_MS), `stops_holding_at` the lowest rate where either is past it (None: every rate held).
With `--temporal production` Temporal is its production server on PostgreSQL (testbed.temporal_server).

Every run goes all the way to Succeeded with an already-running agent (Agent.endpoint) and the scripted model,
so what is measured is ksquad's path, not sandbox boot (bench.sandboxes measures that). All components share
the machine: `cpu_seconds` says what each used, `machine_busy` how loaded the machine was. A rate the
machine cannot sustain shows as queueing in the latencies.
"""

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from agent.scripted_model import ScriptedModel, build_app
from bench.stats import cpu_by_role, cpu_seconds, percentiles, report
from dev.devserver import DevServer, ExternalTemporal
from kube import Config, Kube, path
from testbed.agents import MODEL_KEY, ModelEndpoint
from testbed.asgi import serving
from testbed.controlplane import ControlPlane
from testbed.embedded import TemporalKind, temporal_of_kind
from testbed.isolate import free_port
from testbed.stack import RUN_API, Stack, build_stack
from workflows.status import Phase

TERMINAL = {p.value for p in Phase if p.terminal}
CRDS = Path(__file__).parents[1] / "charts" / "ksquad" / "crds" / "ksquad.io.yaml"
STATUS_P99_MS = 500
T = TypeVar("T")


@contextlib.asynccontextmanager
async def remote_stack(
    plane: ControlPlane, state: ScriptedModel, temporal: TemporalKind, root: Path
) -> AsyncIterator[tuple[Stack, Kube]]:
    """Temporal of `temporal`'s kind, the scripted model, ksquad as the chart deploys it on `plane`, and the agent
    server as a long-lived process behind the Agent `remote` (start_remote_agent); all stopped after."""
    async with (
        temporal_of_kind(temporal, root) as address,
        serving(build_app(state)) as model_url,
        DevServer(ui=False) if address is None else ExternalTemporal(address=address) as dev_server,
        Kube(Config.from_kubeconfig(plane.admin_kubeconfig)) as admin,
    ):
        stack = await build_stack(plane, dev_server, ModelEndpoint(f"{model_url}/v1", state), admin, root)
        agent = start_remote_agent(stack)
        try:
            yield stack, admin
        finally:
            agent.terminate()
            agent.wait(10)
            stack.stop()


async def main(runs: int, rates: list[float], temporal: TemporalKind = "dev") -> None:
    plane, state = start_plane()
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with remote_stack(plane, state, temporal, Path(tmp)) as (stack, admin):
                pids = {
                    "worker": stack.processes["worker"].pid,
                    "bridge": stack.processes["bridge"].pid,
                    "kube-apiserver": plane.processes["kube-apiserver"].pid,
                    "etcd": plane.processes["etcd"].pid,
                }
                for rate in rates:
                    before, busy = {name: cpu_seconds(pid) for name, pid in pids.items()}, machine_ticks()
                    roles = cpu_by_role()
                    phase = await measure(stack, admin, f"r{rate:g}".replace(".", "-"), runs, rate)
                    phase["machine_busy"] = round(busy_fraction(busy, machine_ticks()), 2)
                    after = cpu_by_role()
                    phase["cpu_seconds"] = {
                        **{name: round(cpu_seconds(pid) - before[name], 2) for name, pid in pids.items()},
                        # Temporal (and its PostgreSQL) by role: the dev server, or the production server
                        **{
                            role: round(after[role] - roles.get(role, 0.0), 2)
                            for role in ("temporal", "postgresql")
                            if role in after
                        },
                    }
                    results[f"{rate:g}_runs_per_second"] = phase
                    if phase["phases"].get("Succeeded") != runs:
                        print(
                            f"bridge log:\n{stack.log('bridge')[-4000:]}\n"
                            f"worker log:\n{stack.log('worker')[-4000:]}",
                            file=sys.stderr,
                        )
    finally:
        plane.stop()
    report(
        "bridge",
        {
            "temporal": temporal,
            "runs_per_rate": runs,
            **sustained(results),
            "targets_ms": {
                "create_to_phase": {"p50": 100, "p99": 500},
                "state_change_to_mirrored": {"p99": 500},
            },
            **results,
        },
    )


def start_plane() -> tuple[ControlPlane, ScriptedModel]:
    """The control plane with its node and ksquad's CRDs, and a scripted model whose every answer is "done"."""
    plane = ControlPlane()
    plane.start()
    plane.start_node()
    plane.kubectl("apply", "--server-side", "-f", str(CRDS))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
    state = ScriptedModel()
    state.load({"models": {"dev-model": [{"text": "done"}]}})
    return plane, state


def sustained(results: dict[str, Any]) -> dict[str, float | None]:
    """The highest rate measured whose status p99s held STATUS_P99_MS, and the lowest that did not."""

    def held(doc: dict[str, Any]) -> bool:
        return (
            all(
                doc[figure]["p99_ms"] <= STATUS_P99_MS
                for figure in ("create_to_phase", "state_change_to_mirrored")
            )
            and doc["phases"].get("Succeeded") == doc["runs"]
        )

    return holding_range(results, held)


def holding_range(results: dict[str, Any], held: Callable[[dict[str, Any]], bool]) -> dict[str, float | None]:
    """Of a rate sweep's results (`<rate>_<unit>_per_second` -> figures), the highest rate that `held` and the
    lowest that did not (None when there is none)."""
    rates = sorted((float(k.split("_")[0]), doc) for k, doc in results.items() if k.endswith("_per_second"))
    holding = [rate for rate, doc in rates if held(doc)]
    failing = [rate for rate, doc in rates if not held(doc)]
    return {"holds_at_most": max(holding, default=None), "stops_holding_at": min(failing, default=None)}


async def create_at_rate(
    kube: Kube, url: str, bodies: dict[str, dict[str, Any]], rate: float, stamp: Callable[[], T]
) -> dict[str, T]:
    """Create the Runs of `bodies` (name -> object, its metadata beside the name) one after another at `rate` per
    second; when each request went out, by `stamp`."""
    created: dict[str, T] = {}
    started = time.perf_counter()
    for i, (name, body) in enumerate(bodies.items()):
        created[name] = stamp()
        metadata = {"name": name, **body.get("metadata", {})}
        await kube.create(url, {"apiVersion": RUN_API, "kind": "Run", **body, "metadata": metadata})
        await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.perf_counter()))
    return created


def start_remote_agent(stack: Stack) -> subprocess.Popen[bytes]:
    """The agent server as a long-lived process, and an Agent `remote` that points at it."""
    port = free_port()
    # a shared endpoint: it answers the workers signing with the stack's endpoint key, and reads the model key
    # mounted for the namespace its runs come from
    secrets = stack.root / "remote-secrets"
    (secrets / stack.namespace / "model-key").mkdir(parents=True, exist_ok=True)
    (secrets / stack.namespace / "model-key" / "apiKey").write_text(MODEL_KEY)
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent.server", "--host", "127.0.0.1", "--port", str(port)],
        env={
            **os.environ,
            "KSQUAD_ENDPOINT_TOKEN_KEY_FILE": str(stack.endpoint_key),
            "KSQUAD_SECRETS_DIR": str(secrets),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.apply(*stack.resources(stack.model, "remote", endpoint=f"http://127.0.0.1:{port}/"))
    return agent


async def measure(stack: Stack, admin: Kube, prefix: str, runs: int, rate: float) -> dict[str, Any]:
    """Create `runs` Runs at `rate` per second; watch them to the end."""
    url = path(RUN_API, "runs", stack.namespace)
    first_phase: dict[str, float] = {}
    mirror_ms: list[float] = []
    seen_revisions: set[tuple[str, int]] = set()
    phases: dict[str, str] = {}

    async def watch(version: str) -> None:
        while True:
            async for event in admin.watch(url, resource_version=version, timeout_seconds=60):
                now_wall, now_mono = datetime.now(UTC), time.perf_counter()
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                name, status = obj["metadata"].get("name", ""), obj.get("status") or {}
                if event["type"] == "BOOKMARK" or not name.startswith(prefix):
                    continue
                if status.get("phase"):
                    phases[name] = status["phase"]
                    first_phase.setdefault(name, now_mono)
                revision, changed = status.get("revision"), status.get("lastTransitionTime")
                if revision and changed and (name, revision) not in seen_revisions:
                    seen_revisions.add((name, revision))
                    at = datetime.fromisoformat(changed.replace("Z", "+00:00"))
                    mirror_ms.append((now_wall - at).total_seconds() * 1000)

    watcher = asyncio.create_task(watch((await admin.list(url))["metadata"]["resourceVersion"]))
    started = time.perf_counter()
    bodies = {f"{prefix}-{i:04d}": {"spec": {"agents": ["remote"]}} for i in range(runs)}
    created = await create_at_rate(admin, url, bodies, rate, time.perf_counter)
    for _ in range(2400):
        if sum(phase in TERMINAL for phase in phases.values()) == runs:
            break
        await asyncio.sleep(0.25)
    watcher.cancel()
    return {
        "create_to_phase": percentiles(
            [(first_phase[n] - created[n]) * 1000 for n in created if n in first_phase]
        ),
        "state_change_to_mirrored": percentiles(mirror_ms),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "runs": runs,
        "phases": dict(Counter(phases.values())),
    }


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / max(1, after[1] - before[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="Runs per rate")
    parser.add_argument("--rates", default="2,4,8,12", help="Run creations per second, one measurement each")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    asyncio.run(main(args.runs, [float(r) for r in args.rates.split(",")], args.temporal))
