"""The workflows call activities through the typed stubs of `workflows.activity_types`; the worker and the bridge
implement them. A name or a type changed on one side only fails here, not in a running workflow."""

import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from temporalio import activity

import activities
import crd_bridge
import dev
import worker
from activities.hello import compose_greeting
from workflows.activity_types import STUBS, Activity

# Every package that registers activities on a worker (the production worker's, the bridge's, the embedded stack's).
IMPLEMENTING_PACKAGES = (activities, crd_bridge, worker, dev)
NOT_CALLED_BY_RUNS = {activity._Definition.must_from_callable(compose_greeting).name}  # the hello workflow's


def definition_name(fn: Callable[..., Any]) -> str | None:
    defn = activity._Definition.from_callable(fn)
    return defn.name if defn is not None else None


def implementations() -> Iterator[tuple[str, str, Callable[..., Any]]]:
    """(activity name, where, function) for every activity defined in the implementing packages."""
    for package in IMPLEMENTING_PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if ".migrations" in info.name:  # Alembic's scripts run only under Alembic
                continue
            module = importlib.import_module(info.name)
            for owner_name, owner in inspect.getmembers(
                module, lambda m: inspect.isclass(m) or inspect.isfunction(m)
            ):
                if getattr(owner, "__module__", None) != module.__name__:
                    continue
                functions = (
                    inspect.getmembers(owner, inspect.isfunction) if inspect.isclass(owner) else [("", owner)]
                )
                for fn_name, fn in functions:
                    if (name := definition_name(fn)) is not None:
                        yield name, f"{module.__name__}.{owner_name}{'.' + fn_name if fn_name else ''}", fn


def signature(fn: Callable[..., Any]) -> tuple[list[Any], Any]:
    hints = typing.get_type_hints(fn)
    params = [hints.get(p.name) for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return params, hints.get("return")


FOUND = sorted(implementations(), key=lambda found: found[1])
STUB_BY_NAME = {definition_name(stub): stub for stub in STUBS}


def test_every_stub_names_an_activity_and_every_activity_has_an_implementation() -> None:
    assert set(STUB_BY_NAME) == {a.value for a in Activity}
    implemented = {name for name, _, _ in FOUND}
    assert set(STUB_BY_NAME) <= implemented, f"no implementation of {set(STUB_BY_NAME) - implemented}"
    assert implemented - set(STUB_BY_NAME) <= NOT_CALLED_BY_RUNS, "an activity without a stub"


@pytest.mark.parametrize(("name", "where", "fn"), FOUND, ids=[where for _, where, _ in FOUND])
def test_each_implementation_has_its_stubs_signature(name: str, where: str, fn: Callable[..., Any]) -> None:
    if name in NOT_CALLED_BY_RUNS:
        return
    assert signature(fn) == signature(STUB_BY_NAME[name]), f"{where} implements {name} with another signature"


def test_a_changed_parameter_type_is_caught() -> None:
    """The check itself: an implementation whose parameter type differs from its stub's does not match."""
    from workflows.activity_types import ClaimRequest, ClaimUpdate

    @activity.defn(name=Activity.CLAIM_WORK_ITEM)
    async def claim_work_item(req: ClaimUpdate) -> Any:  # the stub takes a ClaimRequest
        raise NotImplementedError

    assert signature(claim_work_item) != signature(STUB_BY_NAME[Activity.CLAIM_WORK_ITEM])
    assert signature(STUB_BY_NAME[Activity.CLAIM_WORK_ITEM])[0] == [ClaimRequest]
