"""`make bench` (`python -m bench`): every benchmark, each in its own process (each starts its own servers),
into `bench/results/<date>.json`, then a short table of the headline figures against DESIGN.md's targets.

    python -m bench [--quick] [--only overhead,paused] [--resume bench/results/<date>.json]

`--quick` runs each with small counts (minutes, not the four hours of the full set: each paused-scale run of
10,000 Runs takes about an hour, and so does growing the bridge's namespace to 10,000 Runs); the report says
which counts were used. The results file is written again after each benchmark, with the commit measured, so
a full run stopped part way keeps what it measured; `--resume` continues it (the benchmarks it has no result for, or
whose run failed), from a clean tree whose product is the one measured (only bench/ and the docs may differ);
each benchmark's result names its commit.
"""

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import commit_of

STORIES = ("one_attempt", "retried_once", "paused_and_resumed")  # bench.actions' Runs

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "bench" / "results"
# What may differ between the commits of one run's benchmarks (--resume): not the product.
SAME_PRODUCT = ("bench", "docs", "README.md")

# name -> (full arguments, quick arguments)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "claims": ([], ["--iterations", "200"]),
    "devserver_journal": ([], ["--workflows", "100", "--rounds", "1"]),
    "agent_roundtrip": ([], ["--iterations", "50"]),
    "checkpoints": ([], ["--turns", "100"]),
    "sandboxes": ([], ["--runs", "10"]),
    "warm_claims": ([], ["--rates", "0.25,0.5", "--seconds", "20", "--replicas", "4"]),
    "warm_claims@production": (
        ["--temporal", "production"],
        ["--rates", "0.25,0.5", "--seconds", "20", "--replicas", "4", "--temporal", "production"],
    ),
    "sandbox_claims": ([], ["--rates", "20:10,45:5,75:3", "--replicas", "60", "--nodes", "4"]),
    # the rate this machine's control plane sustains for a minute (45/s needs ~2.7 cores of it: docs/operating.md)
    "sandbox_claims@30": (["--rates", "30:60"], ["--rates", "30:10", "--replicas", "60", "--nodes", "4"]),
    "bridge": ([], ["--runs", "40", "--rates", "2,6,12"]),
    "bridge@production": (
        ["--temporal", "production"],
        ["--runs", "40", "--rates", "2,6,12", "--temporal", "production"],
    ),
    "bridge_scale@production": (
        ["--temporal", "production"],
        ["--populations", "100,1000", "--probe", "20", "--temporal", "production"],
    ),
    "overhead": ([], ["--runs", "20", "--batch", "10", "--rounds", "2"]),
    "actions": ([], []),
    # the same against the fair limit with a warm sandbox each, on the real node
    "sandbox_overhead": ([], ["--runs", "4", "--batch", "3", "--rounds", "1"]),
    "sandbox_overhead@production": (
        ["--temporal", "production"],
        ["--runs", "4", "--batch", "3", "--rounds", "1", "--temporal", "production"],
    ),
    "run_profile": ([], ["--runs", "10", "--batch", "10"]),
    "workflow_sandbox": ([], ["--runs", "5", "--times", "3"]),
    "actions@production": (["--temporal", "production"], ["--temporal", "production"]),
    "throughput": ([], ["--runs", "60"]),
    # the same two on Temporal's production server (PostgreSQL persistence and visibility), side by side
    "overhead@production": (
        ["--temporal", "production"],
        ["--runs", "20", "--batch", "10", "--rounds", "2", "--temporal", "production"],
    ),
    "throughput@production": (["--temporal", "production"], ["--runs", "60", "--temporal", "production"]),
    "cancel": ([], ["--runs", "5"]),
    "paused": ([], ["--runs", "500"]),
    "paused@production": (["--temporal", "production"], ["--runs", "500", "--temporal", "production"]),
    # the moonshot (100,000 over 100 credentials) measured at 10,000 over 100 and scaled (bench.paused's doc)
    "paused@production-100-credentials": (
        ["--temporal", "production", "--credentials", "100", "--project", "100000"],
        ["--runs", "500", "--credentials", "10", "--project", "100000", "--temporal", "production"],
    ),
    "fairness": ([], ["--burst", "200", "--heavy", "120", "--light", "60", "--weights-rate", "1.5"]),
    "noisy": ([], ["--seconds", "15", "--decoys", "1000"]),
    "tracing": ([], ["--runs", "15", "--batch", "20", "--rounds", "1"]),
}


def dig(doc: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


# (benchmark, figure, how to read it, target, within target?)
Row = tuple[str, str, Callable[[dict[str, Any]], Any], str, Callable[[Any], bool] | None]
ROWS: list[Row] = [
    *(
        row
        for server in ("", "@production")  # the dev server, and Temporal's production server on PostgreSQL
        for row in (
            (
                f"overhead{server}",
                "run latency ksquad / the fair limit (p50)",
                lambda d: dig(d, "against_the_fair_limit", "latency_ratio_p50"),
                "<= 1.15",
                lambda v: v <= 1.15,
            ),
            (
                f"overhead{server}",
                "throughput ksquad / the fair limit",
                lambda d: dig(d, "against_the_fair_limit", "throughput_share"),
                ">= 0.85",
                lambda v: v >= 0.85,
            ),
            (
                f"overhead{server}",
                "run latency ksquad / bare (p50)",
                lambda d: dig(d, "against_bare", "latency_ratio_p50"),
                "<= 1.25",
                lambda v: v <= 1.25,
            ),
            (
                f"overhead{server}",
                "throughput ksquad / bare",
                lambda d: dig(d, "against_bare", "throughput_share"),
                ">= 0.8",
                lambda v: v >= 0.8,
            ),
            (
                f"overhead{server}",
                "the envelope: CPU us per run / share of latency p50",
                lambda d: _values(d.get("envelope"), "cpu_us_per_run", "share_of_run_latency_p50"),
                "",
                None,
            ),
            (
                f"overhead{server}",
                "a run's history: events / workflow tasks / actions / bytes",
                lambda d: _values(
                    d.get("what_a_run_does"), "history_events", "workflow_tasks", "actions", "history_bytes"
                ),
                "",
                None,
            ),
            (
                f"overhead{server}",
                "the fair limit's history: events / workflow tasks / actions / bytes",
                lambda d: _values(
                    d.get("what_the_fair_limit_does"),
                    "history_events",
                    "workflow_tasks",
                    "actions",
                    "history_bytes",
                ),
                "",
                None,
            ),
            (
                f"sandbox_overhead{server}",
                "with warm sandboxes: run latency ksquad / the fair limit (p50)",
                lambda d: dig(d, "against_the_fair_limit", "latency_ratio_p50"),
                "<= 1.15",
                lambda v: v <= 1.15,
            ),
            (
                f"sandbox_overhead{server}",
                "with warm sandboxes: throughput ksquad / the fair limit",
                lambda d: dig(d, "against_the_fair_limit", "throughput_share"),
                ">= 0.85",
                lambda v: v >= 0.85,
            ),
            (
                f"actions{server}",
                "events: one attempt / retried once / paused and resumed",
                lambda d: tuple(dig(d, "runs", story, "history_events") for story in STORIES),
                "",
                None,
            ),
            (
                f"actions{server}",
                "Temporal Cloud actions: the same three",
                lambda d: tuple(dig(d, "runs", story, "actions") for story in STORIES),
                "",
                None,
            ),
            (
                f"actions{server}",
                "a one-attempt Run / the fair limit: events, actions, bytes",
                lambda d: _values(
                    d.get("one_attempt_over_the_fair_limit"), "history_events", "actions", "history_bytes"
                ),
                "",
                None,
            ),
            (
                f"throughput{server}",
                "ksquad's CPU / Temporal's and its database's, a Run",
                lambda d: dig(d, "1_worker", "ksquad_over_temporal_and_database"),
                "<= 0.5",
                lambda v: v <= 0.5,
            ),
            (
                f"throughput{server}",
                "runs/s, 1 worker process",
                lambda d: dig(d, "1_worker", "runs_per_second"),
                "",
                None,
            ),
            (
                f"throughput{server}",
                "runs/s, 2 worker processes",
                lambda d: dig(d, "2_workers", "runs_per_second"),
                "",
                None,
            ),
            *(
                (
                    f"throughput{server}",
                    f"CPU ms per run: {role}",
                    (lambda key: lambda d: dig(d, "1_worker", "cpu_ms_per_run", key))(role),
                    "",
                    None,
                )
                for role in ("worker", "stack", "agent", "temporal", "postgresql")
            ),
            (
                f"throughput{server}",
                "CPU ms per run: ksquad's own (worker + stack)",
                lambda d: dig(d, "1_worker", "ksquad_cpu_ms_per_run"),
                "",
                None,
            ),
        )
    ),
    *(
        row
        for name in ("paused", "paused@production")
        for row in (
            (name, "runs paused at once", lambda d: d.get("runs"), "10000", lambda v: v >= 10_000),
            (
                name,
                "model calls while paused",
                lambda d: d.get("model_calls_during_pause"),
                "0",
                lambda v: v == 0,
            ),
            (
                name,
                "resume lateness p99 (ms)",
                lambda d: dig(d, "resume_lateness", "p99_ms"),
                "<= 500",
                lambda v: v <= 500,
            ),
            (
                name,
                "worker RSS while paused (MB)",
                lambda d: dig(d, "rss_mb_while_paused", "worker", "max"),
                "<= 200",
                lambda v: v <= 200,
            ),
            (name, "time to drain (s)", lambda d: d.get("seconds_to_drain"), "", None),
        )
    ),
    *(
        (
            "paused@production-100-credentials",
            figure,
            read,
            target,
            ok,
        )
        for figure, read, target, ok in (
            ("runs paused at once / credentials", lambda d: _values(d, "runs", "credentials"), "", None),
            ("model calls while paused", lambda d: d.get("model_calls_during_pause"), "0", lambda v: v == 0),
            (
                "resume lateness p99 (ms)",
                lambda d: dig(d, "resume_lateness", "p99_ms"),
                "<= 500",
                lambda v: v <= 500,
            ),
            (
                "worker RSS while paused (MB)",
                lambda d: dig(d, "rss_mb_while_paused", "worker", "max"),
                "<= 300",
                lambda v: v <= 300,
            ),
            (
                "scaled to 100,000: PostgreSQL GB / CPU h to pause (Temporal, PostgreSQL)",
                lambda d: (
                    dig(d, "projected", "database_disk_gb", "postgresql"),
                    dig(d, "projected", "cpu_hours_to_pause", "temporal"),
                    dig(d, "projected", "cpu_hours_to_pause", "postgresql"),
                ),
                "",
                None,
            ),
        )
    ),
    *(
        row
        for name in ("bridge", "bridge@production")
        for row in (
            (name, "status p99s <= 500 ms up to (runs/s)", lambda d: d.get("holds_at_most"), "", None),
            (name, "status p99s past 500 ms from (runs/s)", lambda d: d.get("stops_holding_at"), "", None),
            (
                name,
                "apply -> status.phase p50 / p99 (ms), at that rate",
                lambda d: _percentiles(dig(d, _held_rate(d), "create_to_phase")),
                "<= 100 / 500",
                lambda v: v[0] <= 100 and v[1] <= 500,
            ),
            (
                name,
                "state change -> mirrored p50 / p99 (ms), at that rate",
                lambda d: _percentiles(dig(d, _held_rate(d), "state_change_to_mirrored")),
                "<= - / 500",
                lambda v: v[1] <= 500,
            ),
        )
    ),
    (
        "sandboxes",
        "warm claim p50 / p99 (ms)",
        lambda d: _percentiles(d.get("warm_claim")),
        "<= 50 / 200",
        lambda v: v[0] <= 50 and v[1] <= 200,
    ),
    *(
        row
        for name in ("warm_claims", "warm_claims@production")
        for row in (
            (
                name,
                "sustained warm claims/s, whole runs (45/s: peer)",
                lambda d: d.get("holds_at_most"),
                ">= 45",
                lambda v: v >= 45,
            ),
            (
                name,
                "claim p50 / p90 / p99 (ms), at that rate",
                lambda d: _values(
                    dig(d, _held_rate(d, "claims_per_second"), "claim"), "p50_ms", "p90_ms", "p99_ms"
                ),
                "<= 50 / - / 200",
                lambda v: v[0] <= 50 and v[2] <= 200,
            ),
            (
                name,
                "cold fallbacks / refills per s, at that rate",
                lambda d: _values(
                    dig(d, _held_rate(d, "claims_per_second")), "cold_fallbacks", "refilled_per_second"
                ),
                "0 / -",
                lambda v: v[0] == 0,
            ),
            (
                name,
                "CPU ms per claim: machine / ksquad's own",
                lambda d: _values(
                    dig(d, _held_rate(d, "claims_per_second")), "cpu_ms_per_claim", "ksquad_cpu_ms_per_claim"
                ),
                "",
                None,
            ),
        )
    ),
    *(
        row
        for name, rate, target, ok in (
            ("sandbox_claims@30", "30", "<= 50 / - / 200", lambda v: v[0] <= 50 and v[2] <= 200),
            ("sandbox_claims", "45", "<= 50 / - / 200", lambda v: v[0] <= 50 and v[2] <= 200),
            ("sandbox_claims", "75", "<= - / - / 500", lambda v: v[2] <= 500),
        )
        for row in (
            (
                name,
                f"kwok: claim p50 / p90 / p99 (ms) at {rate}/s",
                (lambda key: lambda d: _values(dig(d, key, "claim"), "p50_ms", "p90_ms", "p99_ms"))(
                    f"{rate}_claims_per_second"
                ),
                target,
                ok,
            ),
            (
                name,
                f"kwok: ksquad / agent-sandbox at {rate}/s: API writes, p99, control-plane CPU",
                (
                    lambda key: (
                        lambda d: _values(
                            dig(d, key, "ksquad_over_agent_sandbox"), "api_writes", "p99", "control_plane_cpu"
                        )
                    )
                )(f"{rate}_claims_per_second"),
                "<= 0.5 / 0.5 / -",
                lambda v: v[0] <= 0.5 and v[1] <= 0.5,
            ),
            (
                name,
                f"kwok: double binds / conflicts / cold at {rate}/s",
                (lambda key: lambda d: _values(dig(d, key), "double_binds", "conflicts", "cold_fallbacks"))(
                    f"{rate}_claims_per_second"
                ),
                "0 / - / 0",
                lambda v: v[0] == 0 and v[2] == 0,
            ),
        )
    ),
    *(
        row
        for population in ("100", "1000", "10000")
        for row in (
            (
                "bridge_scale@production",
                f"{population} Runs: apply -> phase / mirrored p99 (ms)",
                (
                    lambda key: (
                        lambda d: (
                            dig(d, key, "probe", "create_to_phase", "p99_ms"),
                            dig(d, key, "probe", "state_change_to_mirrored", "p99_ms"),
                        )
                    )
                )(f"{population}_runs"),
                "<= 500 / 500",
                lambda v: v[0] <= 500 and v[1] <= 500,
            ),
            (
                "bridge_scale@production",
                f"{population} Runs: bridge RSS MB / CPU ms a reconcile",
                (
                    lambda key: (
                        lambda d: (
                            dig(d, key, "bridge_rss_mb"),
                            dig(d, key, "bridge_cpu_ms_per_reconcile"),
                        )
                    )
                )(f"{population}_runs"),
                "",
                None,
            ),
            (
                "bridge_scale@production",
                f"{population} Runs: restart, s to reconcile all / CPU ms a Run",
                (
                    lambda key: (
                        lambda d: (
                            dig(d, key, "restart", "seconds_to_reconcile_all"),
                            dig(d, key, "restart", "cpu_ms_per_run"),
                        )
                    )
                )(f"{population}_runs"),
                "",
                None,
            ),
        )
    ),
    (
        "sandbox_claims",
        "kwok: highest rate held (claims/s)",
        lambda d: d.get("holds_at_most"),
        ">= 45",
        lambda v: v >= 45,
    ),
    (
        "sandbox_claims",
        "kwok: CPU ms a claim, claimer / API server, there",
        lambda d: _values(
            dig(d, _held_rate(d, "claims_per_second"), "cpu_ms_per_claim_by_process"),
            "stack",
            "kube-apiserver",
        ),
        "",
        None,
    ),
    (
        "fairness",
        "B's p95 limit end -> call, beside A's burst / alone",
        lambda d: dig(d, "fair", "b_p95_over_baseline"),
        "<= 2",
        lambda v: v <= 2,
    ),
    (
        "fairness",
        "the same in pause order (before fair ramps)",
        lambda d: dig(d, "pause_order", "b_p95_over_baseline"),
        "",
        None,
    ),
    (
        "fairness",
        "weights 2:1, calls per minute min / max ratio",
        lambda d: _values(d.get("weights"), "ratio_min", "ratio_max"),
        "1.8 - 2.2",
        lambda v: v[0] >= 1.8 and v[1] <= 2.2,
    ),
    (
        "fairness",
        "Jain's index per weight, worst minute",
        lambda d: dig(d, "weights", "jain_min"),
        ">= 0.95",
        lambda v: v >= 0.95,
    ),
    ("sandboxes", "cold / warm (p50)", lambda d: d.get("cold_over_warm_p50"), ">= 10", lambda v: v >= 10),
    (
        "claims",
        "claim+release / bare (p50), PostgreSQL",
        lambda d: dig(d, "postgresql", "ratio_p50"),
        "",
        None,
    ),
    ("agent_roundtrip", "invoke_agent p50 (ms)", lambda d: dig(d, "invoke_agent", "p50_ms"), "", None),
    *(
        (
            "checkpoints",
            f"a model turn's checkpoints, {where}: ms p50 / p99, fence check p50, bytes stored",
            (
                lambda db: (
                    lambda d: (
                        dig(d, db, "per_turn", "p50_ms"),
                        dig(d, db, "per_turn", "p99_ms"),
                        dig(d, db, "fence_check", "p50_ms"),
                        dig(d, db, "bytes_stored_per_turn"),
                    )
                )
            )(where),
            "",
            None,
        )
        for where in ("sqlite", "postgresql")
    ),
    (
        "cancel",
        "Running -> Cancelled p50 / p99 (ms)",
        lambda d: _percentiles(d.get("running_to_cancelled_ms")),
        "p50 <= 1000",
        lambda v: v[0] <= 1000,
    ),
    (
        "run_profile",
        "CPU ms per Run: the stack (profiled) / the agent / Temporal",
        lambda d: _values(d.get("cpu_ms_per_run"), "stack", "agent", "temporal"),
        "",
        None,
    ),
    (
        "workflow_sandbox",
        "Temporal's sandbox (pydantic passed through): replays / share of throughput it would cost",
        lambda d: _values(
            dig(d, "runners", "sandboxed, pydantic passed through (Temporal's advice)"),
            "replays",
            "throughput_cost",
        ),
        "cost > 0.10: keep the unsandboxed runner",
        None,
    ),
    (
        "cancel",
        "Paused -> Cancelled p50 / p99 (ms)",
        lambda d: _percentiles(d.get("paused_to_cancelled_ms")),
        "",
        None,
    ),
    (
        "noisy",
        "B's run latency p99 flooded / alone",
        lambda d: d.get("b_p99_flooded_over_alone"),
        "<= 1.2",
        lambda v: v <= 1.2,
    ),
    (
        "noisy",
        "B's status lag p99 alone / flooded (ms)",
        lambda d: (dig(d, "b_alone", "status_lag", "p99_ms"), dig(d, "b_flooded", "status_lag", "p99_ms")),
        "",
        None,
    ),
    (
        "noisy",
        "worker's pod copy RSS change under decoys",
        lambda d: d.get("pod_copy_rss_change"),
        "<= 0.1",
        lambda v: abs(v) <= 0.1,
    ),
    ("noisy", "ksquad-api RSS flooded (MB)", lambda d: dig(d, "api_flooded", "rss_mb"), "", None),
    (
        "tracing",
        "tracing on / off: latency p50, throughput",
        lambda d: (d.get("latency_p50_ratio_on_off"), d.get("throughput_ratio_on_off")),
        "<= 1.05, >= 0.95",
        lambda v: v[0] <= 1.05 and v[1] >= 0.95,
    ),
    ("tracing", "spans per traced Run", lambda d: d.get("spans_per_run"), "", None),
]


def _held_rate(doc: dict[str, Any], unit: str = "runs_per_second") -> str:
    """The key of a rate sweep's figures (bench.bridge, bench.warm_claims) at the highest rate that held (or its
    lowest rate, when none did)."""
    rates = sorted(float(k.split("_")[0]) for k in doc if k.endswith(f"_{unit}"))
    rate = doc.get("holds_at_most") or (rates[0] if rates else 0)
    return f"{rate:g}_{unit}"


def _values(doc: Any, *keys: str) -> tuple[float | None, ...] | None:
    return tuple(doc.get(k) for k in keys) if isinstance(doc, dict) else None


def _percentiles(stats: Any) -> tuple[float | None, ...] | None:
    return _values(stats, "p50_ms", "p99_ms")


def run(name: str, args: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    module = name.split("@")[0]  # overhead@production: bench.overhead, on the production server
    done = subprocess.run([sys.executable, "-m", f"bench.{module}", *args], capture_output=True, text=True)
    seconds = round(time.monotonic() - t0, 1)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "stderr": done.stderr[-4000:], "seconds": seconds}
    try:
        doc: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{") :])
    except ValueError:
        return {"error": "no JSON report", "stdout": done.stdout[-4000:], "seconds": seconds}
    return {**doc, "seconds": seconds, "arguments": args}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'benchmark':<24} {'figure':<58} {'value':>18} {'target':>16}  ok"]
    for name, figure, read, target, ok in ROWS:
        doc = results.get(name)
        if doc is None:
            continue
        value = None if "error" in doc else read(doc)
        shown = (
            doc.get("error", "-")
            if value is None
            else (
                " / ".join("-" if v is None else f"{v:g}" for v in value)
                if isinstance(value, tuple)
                else f"{value:g}"
            )
        )
        unknown = value is None or (isinstance(value, tuple) and None in value)
        verdict = "" if ok is None or unknown else ("yes" if ok(value) else "NO")
        lines.append(f"{name:<24} {figure:<58} {shown:>18} {target:>16}  {verdict}")
    return "\n".join(lines)


def resume_refusal(measured: str, commit: str, same_counts: bool) -> str | None:
    """Why a run measured at `measured` may not be continued at `commit` (None: it may). A figure is of one
    product: the two commits may differ only in the benchmarks and the docs, each with a clean tree."""
    if not same_counts:
        return "it was measured with other counts (--quick or not)"
    if measured.endswith("-dirty") or commit.endswith("-dirty"):
        return f"measured at {measured}, this tree is {commit}: a run continues only from clean trees"
    changed = subprocess.run(
        ["git", "diff", "--name-only", measured, commit, "--", ".", *(f":!{p}" for p in SAME_PRODUCT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if changed.returncode != 0:
        return f"cannot compare {measured} with {commit}: {changed.stderr.strip()}"
    if changed.stdout.strip():
        files = ", ".join(changed.stdout.split()[:5])
        return f"the product changed between {measured} and {commit} ({files}): start a new run"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of every benchmark")
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--resume", type=Path, help="a results file of this commit to continue")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmarks {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    commit = commit_of(ROOT)
    if args.resume:
        doc = json.loads(args.resume.read_text())
        refusal = resume_refusal(doc.get("commit", ""), commit, doc.get("quick") == args.quick)
        if refusal:
            parser.error(f"{args.resume}: {refusal}")
        out, stamp, results = args.resume, doc["at"], doc["results"]
    else:
        RESULTS.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
        out, results = RESULTS / f"{stamp}{'-quick' if args.quick else ''}.json", {}
    for name in names:
        if name in results and "error" not in results[name]:
            print(f"bench.{name}: measured already", file=sys.stderr, flush=True)
            continue
        full, quick = BENCHMARKS[name]
        print(f"bench.{name} ...", file=sys.stderr, flush=True)
        results[name] = {**run(name, quick if args.quick else full), "commit": commit}
        document = {"at": stamp, "commit": commit, "quick": args.quick, "results": results}
        out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(results))
    print(f"\nfull results: {out}")


if __name__ == "__main__":
    main()
