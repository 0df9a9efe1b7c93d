"""A benchmark at two commits, interleaved: a baseline commit and this checkout take turns, round after round, so
that both see the same machine (its load, its caches, its thermal state) and a change's effect is not the drift
of the machine between two runs an hour apart.

    python -m bench.interleaved --baseline e783417 [--rounds 3] throughput --runs 200 --workers 1 --temporal production

The baseline is checked out into a temporary git worktree that uses this checkout's virtualenv; each round runs
`python -m bench.<benchmark> <arguments>` there, then here. The report has every round's JSON of each side and,
for the figures named by `--figure` (dotted paths into the report; by default the throughput benchmark's CPU per
run), their means and the change from baseline.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

from bench.stats import commit_of, report

ROOT = Path(__file__).parents[1]
FIGURES = [
    "1_worker.ksquad_cpu_ms_per_run",
    "1_worker.cpu_ms_per_run.worker",
    "1_worker.cpu_ms_per_run.stack",
    "1_worker.cpu_ms_per_run.temporal",
    "1_worker.cpu_ms_per_run.postgresql",
    "1_worker.runs_per_second",
]


def run_in(tree: Path, benchmark: str, arguments: list[str]) -> dict[str, Any]:
    # The tree's own packages first: the virtualenv's editable install points at this checkout's (crd-bridge's
    # too, which is no top-level directory and so is not found through the working directory alone).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "crd-bridge")])}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{benchmark}", *arguments],
        cwd=tree,
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.{benchmark} in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{") :])
    return doc


def figure(doc: dict[str, Any], dotted: str) -> float | None:
    value: Any = doc
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def summary(rounds: dict[str, list[dict[str, Any]]], figures: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in figures:
        sides = {
            side: [v for v in (figure(doc, name) for doc in docs) if v is not None]
            for side, docs in rounds.items()
        }
        if not all(sides.values()):
            continue
        before, after = mean(sides["baseline"]), mean(sides["this"])
        out[name] = {
            "baseline": round(before, 2),
            "this": round(after, 2),
            "change": round(after / before - 1, 3),
            "each": {side: values for side, values in sides.items()},
        }
    return out


def main(
    baseline: str, rounds: int, benchmark: str, arguments: list[str], figures: list[str]
) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="ksquad-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), baseline], cwd=ROOT, check=True)
        try:
            (tree / ".venv").symlink_to(ROOT / ".venv")
            for n in range(rounds):
                print(f"round {n + 1}/{rounds}", file=sys.stderr, flush=True)
                results["baseline"].append(run_in(tree, benchmark, arguments))
                results["this"].append(run_in(ROOT, benchmark, arguments))
            commits = {"baseline": commit_of(tree), "this": commit_of(ROOT)}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    return {
        "benchmark": benchmark,
        "arguments": arguments,
        "rounds": rounds,
        "commits": commits,
        "figures": summary(results, figures),
        "runs": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figure", action="append", help="a dotted path into the report (repeatable)")
    parser.add_argument("benchmark", help="a module of bench/, e.g. throughput")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="its arguments (after --)")
    args = parser.parse_args()
    arguments = args.arguments[1:] if args.arguments[:1] == ["--"] else args.arguments
    report("interleaved", main(args.baseline, args.rounds, args.benchmark, arguments, args.figure or FIGURES))
