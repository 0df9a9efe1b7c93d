"""Noisy neighbours: tenant A floods what ksquad's callers share while tenant B runs a steady stream of Runs; B's
latency beside B alone, and what the flood cost ksquad-api and the worker's copy of warm pods.

- B: the embedded stack (dev server, its worker, the instant agent), Runs applied at `--rate` a second for
  `--seconds`; each timed from its apply until its workflow returned (latency) and from then until its stored
  status said Succeeded (status lag). Once alone, once under A's flood.
- ksquad-api: its own process (`python -m api.cluster`) on B's store, against a Kubernetes control plane
  (testbed.controlplane) that reviews its callers' tokens; A is a person of its namespace.
- A's flood, from its own process (at the lowest CPU priority: a client's machine is not ksquad's) for the whole
  second measurement: twice A's bound of a Run's event streams
  (held; the refused ones asked again after Retry-After), console list polls 20 at a time, made-up bearer tokens
  10 at a time, absurd usage ranges. What each was answered is counted.
- 5,000 decoy pods made to look like a pool's warm pods, in the control plane (no admission policy there): a process
  holding the worker's copy of the pool's pods (activities.sandboxes.warm.WarmPods) reports its RSS before and
  after them.

Goals (issue 44): B's p99 within 1.2x of alone, the pod copy's RSS flat (+-10%), ksquad-api's RSS bounded.

    python -m bench.noisy [--rate 2] [--seconds 30] [--decoys 5000]
"""

import argparse
import asyncio
import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from activities.sandboxes.warm import WarmPods
from bench.stats import cpu_seconds, percentiles, report
from dev.stack import DevStack
from kube import Config, Kube, path
from testbed.controlplane import ControlPlane
from testbed.embedded import NAMESPACE, bench_stack, rss_mb, run_docs
from testbed.isolate import free_port

CRDS = Path(__file__).parents[1] / "charts" / "ksquad" / "crds"
POOL = "p1"


# --- B: a steady stream of Runs ----------------------------------------------------------------------------------


async def steady_runs(dev: DevStack, prefix: str, rate: float, seconds: float) -> dict[str, Any]:
    latency: list[float] = []
    lag: list[float] = []

    async def one(name: str) -> None:
        applied = time.perf_counter()
        await dev.runs.apply(run_docs(name, 1))
        await dev.client.get_workflow_handle(f"{NAMESPACE}/{name}-00000").result()
        returned = time.perf_counter()
        latency.append((returned - applied) * 1000)
        for _ in range(60_000):  # the bridge's mirror of the workflow's last status: what people see
            if ((await dev.runs.get(NAMESPACE, f"{name}-00000")).status or {}).get("phase") == "Succeeded":
                break
            await asyncio.sleep(0.01)
        lag.append((time.perf_counter() - returned) * 1000)

    started, tasks = time.perf_counter(), []
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(f"{prefix}-{i:04d}")))
    await asyncio.gather(*tasks)
    return {"runs": len(tasks), "latency": percentiles(latency), "status_lag": percentiles(lag)}


# --- the control plane, ksquad-api and its people ----------------------------------------------------------------


def person(plane: ControlPlane, namespace: str, name: str) -> str:
    """A person who may read, list and watch the namespace's Runs and work items: their token."""
    plane.kubectl("create", "serviceaccount", name, "-n", namespace)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["ksquad.io"],
                "resources": ["runs", "workitems"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    plane.kubectl(
        "create",
        "rolebinding",
        name,
        f"--role={name}",
        f"--serviceaccount={namespace}:{name}",
        "-n",
        namespace,
    )
    return plane.kubectl("create", "token", name, "-n", namespace, "--duration=2h").stdout.strip()


def start_api(plane: ControlPlane, dev: DevStack, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    key = root / "console-key"
    key.write_text(base64.b64encode(secrets.token_bytes(32)).decode())
    port, health = free_port(), free_port()
    env = {
        **os.environ,
        "KSQUAD_DATABASE_URL": f"sqlite:///{dev.state_dir / 'ksquad.db'}",
        "KUBECONFIG": str(plane.admin_kubeconfig),
        "KSQUAD_API_LISTEN_PORT": str(port),
        "KSQUAD_HEALTH_PORT": str(health),
        "KSQUAD_CONSOLE_KEY_FILE": str(key),
        "KSQUAD_NAMESPACES": NAMESPACE,
    }
    env.pop("KSQUAD_CODEC_KEY_FILE", None)
    api = subprocess.Popen(
        [sys.executable, "-m", "api.cluster"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return api, f"http://127.0.0.1:{port}"


async def api_ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        for _ in range(300):
            try:
                await http.get("/usage")
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"ksquad-api at {url} never answered")


# --- A's flood, in its own process -------------------------------------------------------------------------------


async def flood(url: str, token: str, namespace: str, seconds: float, streams: int) -> dict[str, Any]:
    answered: dict[str, Counter[int]] = {k: Counter() for k in ("streams", "console", "tokens", "usage")}
    deadline = time.monotonic() + seconds
    mine = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:

        async def stream() -> None:
            while time.monotonic() < deadline:
                try:
                    async with http.stream("GET", f"/runs/{namespace}/a-run/events", headers=mine) as opened:
                        answered["streams"][opened.status_code] += 1
                        if opened.status_code == 200:
                            with_timeout = deadline - time.monotonic()
                            await asyncio.wait_for(opened.aread(), timeout=max(0.1, with_timeout))
                        else:
                            await asyncio.sleep(float(opened.headers.get("retry-after", "1")))
                except (TimeoutError, httpx.HTTPError):
                    pass

        async def loop(kind: str, path: str, headers: dict[str, str] | None) -> None:
            while time.monotonic() < deadline:
                made_up = {"Authorization": f"Bearer {uuid.uuid4().hex * 2}"}
                try:
                    answer = await http.get(path, headers=headers or made_up)
                    answered[kind][answer.status_code] += 1
                except httpx.HTTPError:
                    answered[kind][0] += 1

        await asyncio.gather(
            *(stream() for _ in range(streams)),
            *(loop("console", f"/console/runs.frag?namespace={namespace}", mine) for _ in range(20)),
            *(loop("tokens", f"/runs/{namespace}/a-run/artifacts/x", None) for _ in range(10)),
            *(loop("usage", f"/usage?namespace={namespace}&since=99999999999d", mine) for _ in range(2)),
        )
    return {kind: {str(code): n for code, n in sorted(c.items())} for kind, c in answered.items()}


# --- the worker's copy of warm pods, in its own process ----------------------------------------------------------


async def hold_pod_copy(kubeconfig: str, namespace: str, seconds: float) -> None:
    """Hold the copy; print the process's RSS each second (what the parent reads)."""
    async with Kube(Config.from_kubeconfig(Path(kubeconfig))) as kube:
        copy = WarmPods(kube, [(namespace, POOL)])
        copy.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            kept = copy.of_pool(namespace, POOL)
            print(
                json.dumps({"rss_mb": rss_mb(os.getpid()), "kept": None if kept is None else len(kept)}),
                flush=True,
            )
            await asyncio.sleep(1)
        await copy.close()


def decoy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"ksquad.io/state": "warm", "ksquad.io/pool": POOL}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "decoy:1"}]},
    }


async def make_decoys(plane: ControlPlane, namespace: str, count: int) -> None:
    async with Kube(Config.from_kubeconfig(plane.admin_kubeconfig)) as kube:
        names = [f"decoy-{i}" for i in range(count)]

        async def maker() -> None:
            while names:
                await kube.create(path("v1", "pods", namespace), decoy(names.pop()))

        await asyncio.gather(*(maker() for _ in range(16)))


def last_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    return json.loads(line) if line else {}


async def pod_copy_rss(plane: ControlPlane, namespace: str, decoys: int) -> dict[str, Any]:
    holder = subprocess.Popen(
        [sys.executable, "-m", "bench.noisy", "--hold-pods", str(plane.admin_kubeconfig), namespace],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen: dict[str, Any] = {}
        for _ in range(10):
            seen = await asyncio.to_thread(last_line, holder)
        before = seen["rss_mb"]
        await make_decoys(plane, namespace, decoys)
        for _ in range(15):
            seen = await asyncio.to_thread(last_line, holder)
        return {
            "decoys": decoys,
            "rss_mb_before": before,
            "rss_mb_after": seen["rss_mb"],
            "kept": seen["kept"],
        }
    finally:
        holder.kill()


# --- the benchmark -------------------------------------------------------------------------------------------------


async def main(rate: float, seconds: float, decoys: int) -> dict[str, Any]:
    plane = ControlPlane()
    plane.start()
    results: dict[str, Any] = {"rate": rate, "seconds": seconds}
    try:
        plane.kubectl("apply", "--server-side", "-f", str(CRDS))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.wait_for_default_service_account(NAMESPACE)
        run = {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": "a-run", "namespace": NAMESPACE},
        }
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({**run, "spec": {"agents": ["a"]}}))
        a_token = person(plane, NAMESPACE, "tenant-a")
        results["pod_copy"] = await pod_copy_rss(plane, NAMESPACE, decoys)
        with tempfile.TemporaryDirectory() as tmp:
            async with bench_stack(Path(tmp)) as (dev, _agent):
                api, url = start_api(plane, dev, Path(tmp))
                try:
                    await api_ready(url)
                    await steady_runs(dev, "warm", rate, 3)
                    api_cpu, rss_idle = cpu_seconds(api.pid), rss_mb(api.pid)
                    results["b_alone"] = await steady_runs(dev, "alone", rate, seconds)
                    results["api_alone"] = {
                        "cpu_seconds": round(cpu_seconds(api.pid) - api_cpu, 2),
                        "rss_mb": round(rss_mb(api.pid), 1),
                    }
                    # The same two cores with a client's CPU busy beside B and nothing sent to ksquad: what the
                    # flood's client costs B on this machine by itself (on a cluster it is another machine).
                    burning = subprocess.Popen(
                        [sys.executable, "-m", "bench.noisy", "--burn", str(seconds + 5)],
                        preexec_fn=lambda: os.nice(19),
                    )
                    await asyncio.sleep(2)
                    results["b_beside_busy_client"] = await steady_runs(dev, "beside", rate, seconds)
                    burning.kill()
                    burning.wait()
                    api_cpu = cpu_seconds(api.pid)
                    flooding = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.noisy",
                            "--flood",
                            url,
                            a_token,
                            NAMESPACE,
                            str(seconds + 5),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                        # A's client is on A's machine, not ksquad's: here it shares B's two cores, so it
                        # runs at the lowest priority (what it sends is the same; its CPU is not ksquad's).
                        preexec_fn=lambda: os.nice(19),
                    )
                    await asyncio.sleep(2)  # the flood under way
                    results["b_flooded"] = await steady_runs(dev, "flooded", rate, seconds)
                    results["api_flooded"] = {
                        "cpu_seconds": round(cpu_seconds(api.pid) - api_cpu, 2),
                        "rss_mb": round(rss_mb(api.pid), 1),
                        "rss_mb_idle": round(rss_idle, 1),
                    }
                    out, _ = await asyncio.to_thread(flooding.communicate)
                    results["flood_answers"] = json.loads(out or "{}")
                finally:
                    api.terminate()
                    api.wait(10)
    finally:
        plane.stop()
    alone, flooded = results["b_alone"]["latency"]["p99_ms"], results["b_flooded"]["latency"]["p99_ms"]
    results["b_p99_flooded_over_alone"] = round(flooded / alone, 2)
    beside = results["b_beside_busy_client"]["latency"]["p99_ms"]
    results["b_p99_flooded_over_beside_busy_client"] = round(flooded / beside, 2)
    copy = results["pod_copy"]
    results["pod_copy_rss_change"] = round(copy["rss_mb_after"] / copy["rss_mb_before"] - 1, 3)
    results["targets"] = {"b_p99_ratio_max": 1.2, "pod_copy_rss_change_max": 0.1}
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood"]:
        url, token, namespace, seconds = sys.argv[2:6]
        print(json.dumps(asyncio.run(flood(url, token, namespace, float(seconds), streams=64))), flush=True)
    elif sys.argv[1:2] == ["--burn"]:
        until = time.monotonic() + float(sys.argv[2])
        while time.monotonic() < until:
            pass
    elif sys.argv[1:2] == ["--hold-pods"]:
        asyncio.run(hold_pod_copy(sys.argv[2], sys.argv[3], 3600))
    else:
        parser = argparse.ArgumentParser(
            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.add_argument("--rate", type=float, default=2.0, help="B's Runs a second")
        parser.add_argument("--seconds", type=float, default=30.0, help="each measurement's length")
        parser.add_argument("--decoys", type=int, default=5000)
        args = parser.parse_args()
        report("noisy", asyncio.run(main(args.rate, args.seconds, args.decoys)))
