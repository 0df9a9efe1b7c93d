"""Jaeger (v2, the OpenTelemetry Collector-based `jaeger` of release v1.75.0, built from the Go module proxy by
testbed/build-jaeger.sh) as the test bed's tracing backend: OTLP over HTTP in, in-memory storage, its query API on
ports of its own. The trace tests read what ksquad's processes exported back through the query API.

    python -m testbed.jaeger COMMAND...     (make demo TRACES=jaeger)

runs COMMAND with every ksquad process it starts exporting here, then prints the trace of the first Run it started
as a tree. A Jaeger built from the module proxy serves a placeholder page for its UI (the UI's assets are built
from npm sources in Jaeger's own release process): its HTTP API (/api/traces/<id>) has everything."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from dev.binaries import dying_with_parent
from testbed.isolate import free_port, service_address

ROOT = Path(__file__).parents[1]
VERSION = "v1.75.0"


def cached_binary() -> Path:
    """The jaeger binary, built into the cache when missing (a few minutes, once)."""
    out = subprocess.run(
        [str(ROOT / "testbed" / "build-jaeger.sh")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "JAEGER_VERSION": VERSION},
    ).stdout.strip()
    return Path(out) / "jaeger"


def config(otlp: str, query: str, query_grpc: str, health: str) -> dict[str, Any]:
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            # Its own metrics off: their default port (8888) would be shared by every Jaeger of a parallel run.
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": health}},
            "jaeger_query": {
                "storage": {"traces": "memory"},
                "http": {"endpoint": query},
                "grpc": {"endpoint": query_grpc},
            },
            "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": 100000}}}},
        },
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": otlp}}}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}},
    }


@dataclass
class Jaeger:
    otlp_url: str  # OTEL_EXPORTER_OTLP_ENDPOINT
    query_url: str  # the UI and its HTTP API
    process: subprocess.Popen[bytes]
    log: Path

    def otel_env(self, service: str | None = None) -> dict[str, str]:
        """What a process needs to export its spans here at once (a batch every 100 ms, not 5 s)."""
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED": "false",  # as the chart's default (tracing.a2aSdkSpans)
        }
        if service:
            env["OTEL_SERVICE_NAME"] = service
        return env

    def trace_url(self) -> str:
        return f"{self.query_url}/trace/{{trace_id}}"

    async def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace as Jaeger's HTTP API gives it (spans, their processes, references), or None."""
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(f"{self.query_url}/api/traces/{trace_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        data = response.json().get("data") or []
        return data[0] if data else None

    async def search(
        self, service: str, tags: dict[str, str] | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"service": service, "limit": limit, "lookback": "1h"}
        if tags:
            params["tags"] = json.dumps(tags)
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(f"{self.query_url}/api/traces", params=params)
        response.raise_for_status()
        return list(response.json().get("data") or [])


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def service(trace: dict[str, Any], span: dict[str, Any]) -> str:
    return str(trace["processes"][span["processID"]]["serviceName"])


def lineage(trace: dict[str, Any], span: dict[str, Any]) -> list[str]:
    """`service: operation` of the span and each of its parents up to the trace's root."""
    by_id = {s["spanID"]: s for s in trace["spans"]}
    names = []
    current: dict[str, Any] | None = span
    while current is not None:
        names.append(f"{service(trace, current)}: {current['operationName']}")
        parents = [r["spanID"] for r in current.get("references", []) if r["refType"] == "CHILD_OF"]
        current = by_id.get(parents[0]) if parents else None
    return names


def only(trace: dict[str, Any], operation: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [s for s in trace["spans"] if s["operationName"] == operation]
    assert len(found) == 1, (
        f"{len(found)} spans {operation!r}: {sorted(s['operationName'] for s in trace['spans'])}"
    )
    return found[0]


async def wait_trace(jaeger: Jaeger, trace_id: str, *has: str, within: float = 60) -> dict[str, Any]:
    """The trace once a span of each name in `has` is in it (processes export in batches: every 100 ms where the
    test bed sets OTEL_BSP_SCHEDULE_DELAY, every 5 s, the SDK's default, on the installed chart)."""
    trace = None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        trace = await jaeger.trace(trace_id)
        names = {s["operationName"] for s in trace["spans"]} if trace else set()
        if trace is not None and set(has) <= names:
            return trace
        await asyncio.sleep(0.2)
    names = {s["operationName"] for s in trace["spans"]} if trace else set()
    raise AssertionError(
        f"no span {sorted(set(has) - names)} in trace {trace_id} after {within} s: {sorted(names)}"
    )


@asynccontextmanager
async def running_jaeger(root: Path) -> AsyncIterator[Jaeger]:
    binary = cached_binary()
    host = service_address()
    otlp, query, grpc, health = (f"{host}:{free_port()}" for _ in range(4))
    root.mkdir(parents=True, exist_ok=True)
    config_file = root / "jaeger.yaml"
    config_file.write_text(yaml.safe_dump(config(otlp, query, grpc, health)))
    log = root / "jaeger.log"
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    process = subprocess.Popen(
        dying_with_parent([str(binary), "--config", str(config_file)]),
        env={**quiet, "OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "none"},  # no traces of its own
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    jaeger = Jaeger(f"http://{otlp}", f"http://{query}", process, log)
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=1) as http:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"jaeger exited {process.returncode}: {log.read_text()[-3000:]}")
                try:
                    if (await http.get(f"http://{health}/status")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jaeger not ready in 60 s: {log.read_text()[-3000:]}")
                await asyncio.sleep(0.1)
        yield jaeger
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tree(trace: dict[str, Any]) -> list[str]:
    """The trace as lines, each span under its parent, in start order: `service: operation  duration`."""
    spans = sorted(trace["spans"], key=lambda s: s["startTime"])
    ids = {s["spanID"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        parents = [r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
        parent = parents[0] if parents and parents[0] in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            lines.append(
                f"{'  ' * depth}{service(trace, span)}: {span['operationName']}  {span['duration'] / 1000:.1f} ms"
            )
            walk(span["spanID"], depth + 1)

    walk(None, 0)
    return lines


async def _with_traces(command: list[str]) -> int:
    async with running_jaeger(Path(tempfile.mkdtemp(prefix="ksquad-jaeger-"))) as jaeger:
        env = {**os.environ, **jaeger.otel_env()}
        env.pop("OTEL_SERVICE_NAME", None)
        print(f"traces: every ksquad process exports to Jaeger at {jaeger.otlp_url}", flush=True)
        code = await asyncio.to_thread(subprocess.call, command, env=env)
        await asyncio.sleep(1)  # the last batches
        runs = await jaeger.search("ksquad-dev", limit=20)
        starts = [t for t in runs if any(s["operationName"] == "start Run workflow" for s in t["spans"])]
        if not starts:
            print("traces: no Run's trace reached Jaeger", flush=True)
            return code or 1
        first = min(starts, key=lambda t: min(s["startTime"] for s in t["spans"]))
        print(f"\nThe first Run's trace ({len(first['spans'])} spans; {len(starts)} Runs traced):")
        print("\n".join(tree(first)))
        print(
            f"\nAll of it: {jaeger.query_url}/api/traces/{first['traceID']} (while this runs: Enter ends it)"
        )
        if sys.stdin.isatty():
            await asyncio.to_thread(sys.stdin.readline)
        return code


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m testbed.jaeger COMMAND...")
    sys.exit(asyncio.run(_with_traces(sys.argv[1:])))


if __name__ == "__main__":
    main()
