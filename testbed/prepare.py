"""Everything the suite needs before it starts (`make prepare`, which `make test` runs), in three lanes at once on a
machine of more than two cores:

    compile   the Go builds and llama.cpp's server, one after another: each uses every core
    fetch     the Go modules of the compiles to come, downloaded while the one before them compiles
    install   Debian's packages, the two images, the field's virtualenvs and the wheelhouse

and in one lane, one step after another, on two cores or fewer (`--lanes` says which): there every step is bound by
the CPU, downloads included (unpacking, pip's and dpkg's work), and a machine of two cores that had built nothing
took 1,688 s in three lanes against 1,513 s one step at a time (tests/README.md, "The suite's budget").

Each step is a command of its own (the build scripts, `make images`, ...), cached outside the clone and a no-op when
its cache holds it. Its output goes to a log of its own under the cache; a step that fails stops the lanes from
starting more, and the run ends naming the step, its exit status and the end of its log. At the end a table gives
each step's time.

    python -m testbed.prepare                  # every step
    python -m testbed.prepare --only images    # some steps, or whole lanes (--only compile fetch), in their lanes
"""

import argparse
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.pyenvs import cache_root

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "testbed"
# The Go builds in the order the compile lane takes them (the longest first, so the fetch lane keeps ahead).
GO_BUILDS = ("temporal", "jaeger", "agent-sandbox", "kwok", "network-policies")


@dataclass
class Step:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None
    status: str = "not run"  # "ok", "failed (exit N)", "not run"
    log: Path | None = None


def _script(name: str) -> list[str]:
    return ["bash", str(TESTBED / f"build-{name}.sh")]


def lanes(python: str, make: str) -> dict[str, list[Step]]:
    fetch_only = {"KSQUAD_FETCH_ONLY": "1"}
    return {
        "compile": [
            # it downloads etcd's and helm's modules itself, as Kubernetes compiles
            Step("control-plane", _script("control-plane")),
            *(Step(name, _script(name)) for name in GO_BUILDS),
            Step("llama-server", _script("llama-server"), {"PYTHON": python}),
        ],
        "fetch": [Step(f"{name} modules", _script(name), fetch_only) for name in GO_BUILDS],
        "install": [
            Step("host-packages", [make, "--no-print-directory", "host-packages"]),
            # after the packages: podman and mmdebstrap come with them
            Step("images", [make, "--no-print-directory", "images"]),
            Step("field-virtualenvs", [python, "-m", "testbed.pyenvs"]),
            Step("wheelhouse", [make, "--no-print-directory", "wheelhouse"]),
        ],
    }


def _say(text: str) -> None:
    # one write a line: the lanes' lines never mix
    sys.stderr.write(f"[prepare {time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


class Run:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.failed = threading.Event()

    def lane(self, steps: list[Step]) -> None:
        for step in steps:
            if self.failed.is_set():
                return
            self.step(step)

    def step(self, step: Step) -> None:
        step.log = self.logs / f"{step.name.replace(' ', '-')}.log"
        _say(f"start: {step.name}")
        started = time.monotonic()
        with open(step.log, "wb") as out:
            done = subprocess.run(
                step.command, cwd=ROOT, env={**os.environ, **step.env}, stdout=out, stderr=subprocess.STDOUT
            )
        step.seconds = time.monotonic() - started
        if done.returncode == 0:
            step.status = "ok"
            _say(f"done:  {step.name} ({step.seconds:.0f} s)")
        else:
            step.status = f"failed (exit {done.returncode})"
            self.failed.set()
            _say(f"FAILED: {step.name} (exit {done.returncode}, {step.seconds:.0f} s): {step.log}")


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", metavar="STEP", help="run these steps only (in their lanes)")
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"))
    parser.add_argument(
        "--lanes", choices=("auto", "one", "three"), default="auto", help="auto: one on two cores or fewer"
    )
    args = parser.parse_args(argv)
    plan = lanes(sys.executable, args.make)
    if args.only:
        known = {step.name for steps in plan.values() for step in steps} | set(plan)
        unknown = set(args.only) - known
        if unknown:
            parser.error(
                f"no step or lane {', '.join(sorted(unknown))}; there are: {', '.join(sorted(known))}"
            )
        plan = {
            lane: [s for s in steps if lane in args.only or s.name in args.only]
            for lane, steps in plan.items()
        }
    if args.lanes == "one" or (args.lanes == "auto" and (os.cpu_count() or 1) <= 2):
        # The packages first (the images need podman), then the compiles (each fetches its own modules).
        packages = [s for s in plan["install"] if s.name == "host-packages"]
        rest = [s for s in plan["install"] if s.name != "host-packages"]
        plan = {"one": [*packages, *plan["compile"], *rest]}
    logs = cache_root() / "prepare-logs"
    logs.mkdir(parents=True, exist_ok=True)
    run = Run(logs)
    started = time.monotonic()
    threads = [threading.Thread(target=run.lane, args=(steps,), name=lane) for lane, steps in plan.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.monotonic() - started
    print(f"\n{'lane':<8} {'step':<26} {'seconds':>8}  status", file=sys.stderr)
    for lane, steps in plan.items():
        for step in steps:
            seconds = "" if step.seconds is None else f"{step.seconds:.0f}"
            print(f"{lane:<8} {step.name:<26} {seconds:>8}  {step.status}", file=sys.stderr)
    print(f"{'':<8} {'all, in lanes':<26} {total:>8.0f}", file=sys.stderr)
    failed = [s for steps in plan.values() for s in steps if s.status.startswith("failed")]
    for step in failed:
        assert step.log is not None
        print(
            f"\n--- {step.name} {step.status}: {' '.join(step.command)}\n--- end of {step.log}:",
            file=sys.stderr,
        )
        print(_tail(step.log), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
