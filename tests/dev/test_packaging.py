"""What ksquad ships as: the locks hold what pyproject.toml asks for, and a wheel built from the repo, installed into
a clean venv (no checkout on the path), runs `ksquad dev --demo` to the end, so every module, data file and entry
point it needs is in the wheel."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.dev import FREE_PORTS

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pinned(lock: Path) -> dict[str, str]:
    """name -> version of each `name==version` line of a lock."""
    return {
        canonicalize_name(name): version
        for line in lock.read_text().splitlines()
        if "==" in line and not line.startswith((" ", "#"))
        for name, version in [line.split()[0].split("==", 1)]
    }


@pytest.mark.parametrize(
    ("lock", "extras"),
    [
        ("images/requirements.lock", ()),  # the images install only it (offline, hash-checked)
        ("tests/requirements.lock", ("dev", "test")),  # `make venv` installs only it (hash-checked)
    ],
)
def test_each_lock_pins_every_dependency_within_what_pyproject_asks(
    lock: str, extras: tuple[str, ...]
) -> None:
    wanted = [Requirement(d) for d in PROJECT["dependencies"]] + [
        Requirement(d) for extra in extras for d in PROJECT["optional-dependencies"][extra]
    ]
    wanted = [
        r for r in wanted if canonicalize_name(r.name) != "ksquad"
    ]  # test's `ksquad[dev]`: the dev extra
    assert len(wanted) > 10, wanted
    versions = pinned(ROOT / lock)
    missing = sorted(r.name for r in wanted if canonicalize_name(r.name) not in versions)
    assert not missing, f"run `make lock`: {lock} lacks {missing}"
    outside = [
        f"{r} (locked {versions[canonicalize_name(r.name)]})"
        for r in wanted
        if not r.specifier.contains(versions[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not outside, f"run `make lock`: {lock} pins versions pyproject.toml does not allow: {outside}"


def test_every_package_of_the_product_is_in_the_wheel() -> None:
    """setuptools installs the packages pyproject.toml lists, not the folders it finds: a package left out is
    missing from the wheel and the images (the cluster's test of the images says so much later)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    roots = {p.split(".")[0] for p in listed} - {"crd_bridge"}
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for root in roots
        for init in (ROOT / root).rglob("__init__.py")
        if "__pycache__" not in init.parts
    } | {"crd_bridge"}
    assert len(found) > 15, found
    assert found <= listed, f"pyproject.toml's packages lack {sorted(found - listed)}"


def test_the_test_lock_agrees_with_the_images_lock() -> None:
    """The tests run the versions the images ship."""
    images, tests = (
        pinned(ROOT / "images" / "requirements.lock"),
        pinned(ROOT / "tests" / "requirements.lock"),
    )
    assert len(images) > 30, images
    differ = {
        name: (version, tests.get(name)) for name, version in images.items() if tests.get(name) != version
    }
    assert not differ, f"run `make lock`: images/ vs tests/ locks differ: {differ}"


def run(*args: str | Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_wheel_of_the_repo_runs_the_demo_from_a_clean_venv(tmp_path: Path) -> None:
    """Offline, as the test bed is: the clean venv takes setuptools, the wheel's dependencies and the dev extra from
    the locked wheels `make wheelhouse` downloaded (KSQUAD_WHEELHOUSE), at the locked versions."""
    wheelhouse = Path(os.environ.get("KSQUAD_WHEELHOUSE", Path.home() / ".cache" / "ksquad-wheelhouse"))
    assert any(wheelhouse.glob("setuptools-*.whl")), (
        f"no locked wheels in {wheelhouse}: run `make wheelhouse`"
    )
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        "".join(f"{n}=={v}\n" for n, v in pinned(ROOT / "tests" / "requirements.lock").items())
    )
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv, cwd=tmp_path, timeout=120).returncode == 0
    offline: list[str | Path] = ["--no-index", "--find-links", wheelhouse, "-c", constraints]
    pip = venv / "bin" / "pip"
    tools = run(pip, "install", "--quiet", *offline, "setuptools", cwd=tmp_path, timeout=300)
    assert tools.returncode == 0, tools.stderr[-3000:]

    built = run(
        pip,
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "-w",
        tmp_path / "dist",
        ROOT,
        cwd=tmp_path,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "BuildBackendWarning" not in built.stderr, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ksquad-*.whl")
    installed = run(pip, "install", "--quiet", *offline, f"{wheel}[dev]", cwd=tmp_path, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]

    where = run(
        venv / "bin" / "python",
        "-c",
        "import dev.demo, cli; print(dev.demo.EXAMPLES)",
        cwd=tmp_path,
        timeout=60,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.strip().startswith(str(venv)), (
        f"the demo's examples come from the checkout: {where.stdout}"
    )

    demo = run(venv / "bin" / "ksquad", "dev", "--demo", *FREE_PORTS, cwd=tmp_path, timeout=240)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "all three runs ended as expected, and the work item is done" in demo.stdout, demo.stdout[-3000:]
