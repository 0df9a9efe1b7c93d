"""Small helpers shared by the benchmarks."""

import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50_ms": round(pct(50), 3),
        "p90_ms": round(pct(90), 3),
        "p99_ms": round(pct(99), 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


def report(name: str, results: dict[str, Any]) -> None:
    """Print one JSON document: what ran, where, when, and the numbers."""
    doc = {
        "benchmark": name,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": _cpus()},
        **results,
    }
    print(json.dumps(doc, indent=2))


def commit_of(tree: Path) -> str:
    """The commit checked out in `tree`, with "-dirty" when its tracked files have changes."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree, capture_output=True, text=True
    ).stdout.strip()
    return f"{commit}-dirty" if changed else commit


def _cpus() -> int:
    return os.cpu_count() or 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What each process under a benchmark is, by its command line; the benchmark's own process is "stack" (the
# embedded bridge, API, store and scripted model, and the benchmark's driver).
ROLES = (
    ("worker.main", "worker"),
    ("crd_bridge.main", "bridge"),
    ("kube-apiserver", "kube-apiserver"),  # before etcd: its command line names its etcd servers
    ("/etcd ", "etcd"),
    ("kube-controller-manager", "kube-controller-manager"),
    ("kube-scheduler", "kube-scheduler"),
    ("/kwok --", "kwok"),
    ("agent-sandbox-controller", "agent-sandbox"),  # the simulated nodes (testbed/kwok.py)
    ("kubelet", "kubelet"),  # before containerd: its command line names containerd's socket
    ("containerd", "containerd"),
    ("agent.server", "agent"),
    ("start-dev", "temporal"),
    ("temporal-server", "temporal"),
    ("postgres", "postgresql"),
)


def pids_by_role() -> dict[str, list[int]]:
    """This process ("stack") and every live process under it, by role (`ROLES`; anything else is "other")."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    roles: dict[str, list[int]] = {"stack": [os.getpid()]}
    frontier = {os.getpid()}
    while frontier:
        children = {pid for pid, parent in parents.items() if parent in frontier}
        for pid in children:
            try:
                command = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:  # it ended meanwhile
                continue
            role = next((name for pattern, name in ROLES if pattern in command), "other")
            roles.setdefault(role, []).append(pid)
        frontier = children
    return roles


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of this process and every live process under it, summed by role."""
    totals: dict[str, float] = {}
    for role, pids in pids_by_role().items():
        for pid in pids:
            try:
                totals[role] = totals.get(role, 0.0) + cpu_seconds(pid)
            except OSError:
                continue
    return totals


def database_disk_mb() -> dict[str, float]:
    """Disk used by the databases under this process, by role: PostgreSQL's data directory (its `-D`), the dev
    server's SQLite file (its `--db-filename`, with its WAL)."""
    sizes: dict[str, float] = {}
    for role, pids in pids_by_role().items():
        for pid in pids:
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            flag = {"postgresql": b"-D", "temporal": b"--db-filename"}.get(role)
            if flag is None or flag not in args[:-1]:
                continue
            where = Path(args[args.index(flag) + 1].decode())
            files = (
                [f for f in where.rglob("*") if f.is_file()]
                if where.is_dir()
                else where.parent.glob(f"{where.name}*")
            )
            total = 0
            for file in files:
                try:
                    total += file.stat().st_size
                except OSError:  # removed meanwhile (a WAL segment recycled)
                    continue
            sizes[role] = round(total / 2**20, 1)
            break
    return sizes


def cpu_ms_per_run(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    """CPU milliseconds per run of each role between two `cpu_by_role` readings."""
    return {
        role: round((after[role] - before.get(role, 0.0)) * 1000 / runs, 1)
        for role in sorted(after)
        if after[role] > before.get(role, 0.0)
    }
