"""What tracing (tracing/) costs a Run: the embedded stack (one worker process, the instant agent, the scripted
model) with every process exporting its spans to a Jaeger (OTLP over HTTP, batched as the SDK does by default,
a2a-sdk's own spans off as the chart's default), against the same stack with tracing off.

Each mode runs in a fresh stack of its own process (a process traces or not, for its life), in alternating rounds
(off, on, then on, off, ...) so both see the same machine. Latency: Runs one at a time (p50, p90). Throughput: a
batch applied at once (Runs per second). CPU: milliseconds per Run of the stack's process (the embedded bridge and
API), the worker and the agent (bench.stats roles). Reports on/off ratios; the goal is within 5%. Also the spans a
traced Run exports and their bytes as Jaeger returns them.

    python -m bench.tracing [--runs 40] [--batch 40] [--rounds 2]
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tracing
from bench.overhead import ksquad_runs
from bench.stats import cpu_by_role, cpu_ms_per_run, percentiles, report
from testbed.embedded import NAMESPACE, bench_stack, run_docs, start_workers, stop_workers, wait_terminal
from testbed.jaeger import running_jaeger

MODES = ("off", "on")


async def measure(runs: int, batch: int) -> dict[str, Any]:
    """In this process: a stack, warmed, then `runs` Runs one at a time and a batch of `batch`."""
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), serve_worker=False) as (dev, _agent):
            workers = await start_workers(dev, 1)
            try:
                warm = run_docs("warm", 5)
                await dev.runs.apply(warm)
                await wait_terminal(dev, [d["metadata"]["name"] for d in warm], 120)
                before = cpu_by_role()
                latencies = []
                for i in range(runs):
                    one, _ = await ksquad_runs(dev, f"one{i}", 1)
                    latencies += one
                _, wall = await ksquad_runs(dev, "batch", batch)
                cpu = cpu_ms_per_run(before, cpu_by_role(), runs + batch)
                uid = (await dev.runs.get(NAMESPACE, run_docs("one0", 1)[0]["metadata"]["name"])).uid
            finally:
                stop_workers(workers)
    return {
        "latency": percentiles(latencies),
        "batch_runs_per_second": round(batch / wall, 2),
        "cpu_ms_per_run": cpu,
        "uid_of_first": uid,
    }


def child(mode: str, runs: int, batch: int, otlp_env: dict[str, str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if mode == "on":
        env.update(otlp_env)
    done = subprocess.run(
        [sys.executable, "-m", "bench.tracing", "--child", "--runs", str(runs), "--batch", str(batch)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} round failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def main(runs: int, batch: int, rounds: int) -> None:
    measured: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        async with running_jaeger(Path(tmp) / "jaeger") as jaeger:
            otlp_env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_url,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED": "false",
            }
            for n in range(rounds):
                for mode in MODES if n % 2 == 0 else tuple(reversed(MODES)):
                    t0 = time.perf_counter()
                    result = await asyncio.to_thread(child, mode, runs, batch, otlp_env)
                    result["seconds"] = round(time.perf_counter() - t0, 1)
                    measured[mode].append(result)
            await asyncio.sleep(6)  # the SDK's last batch (every 5 s)
            uid = measured["on"][0]["uid_of_first"]
            trace = await jaeger.trace(f"{tracing.trace_id(uid):032x}") if uid else None
    spans = len(trace["spans"]) if trace else 0
    by_mode = {mode: summary(results) for mode, results in measured.items()}
    off, on = by_mode["off"], by_mode["on"]
    report(
        "tracing",
        {
            "runs_one_at_a_time": runs,
            "batch": batch,
            "rounds": rounds,
            "off": off,
            "on": on,
            "latency_p50_ratio_on_off": round(on["latency_p50_ms"] / off["latency_p50_ms"], 3),
            "latency_p90_ratio_on_off": round(on["latency_p90_ms"] / off["latency_p90_ms"], 3),
            "throughput_ratio_on_off": round(on["batch_runs_per_second"] / off["batch_runs_per_second"], 3),
            "ksquad_cpu_ratio_on_off": round(on["ksquad_cpu_ms_per_run"] / off["ksquad_cpu_ms_per_run"], 3),
            "spans_per_run": spans,
            "span_json_bytes_per_run": len(json.dumps(trace)) if trace else 0,
            "goal": "latency and throughput within 5% (ratios 1.05 and 0.95)",
        },
    )


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one mode: their medians' mean, and each round's figures."""

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 2)

    def cpu(result: dict[str, Any]) -> float:
        roles = result["cpu_ms_per_run"]
        return float(roles.get("worker", 0) + roles.get("stack", 0) + roles.get("agent", 0))

    return {
        "latency_p50_ms": mean([r["latency"]["p50_ms"] for r in results]),
        "latency_p90_ms": mean([r["latency"]["p90_ms"] for r in results]),
        "batch_runs_per_second": mean([r["batch_runs_per_second"] for r in results]),
        "ksquad_cpu_ms_per_run": mean([cpu(r) for r in results]),
        "cpu_ms_per_run_by_role": [r["cpu_ms_per_run"] for r in results],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.runs, args.batch))))
    else:
        asyncio.run(main(args.runs, args.batch, args.rounds))
