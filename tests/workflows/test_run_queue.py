"""Queued: a per-scope concurrency gate the run waits on without polling; every finishing run frees its slot."""

import pytest
from temporalio.client import Client

from tests.workflows.world import World, block, failed, run_input, start_run
from workflows.activity_types import Activity
from workflows.contract import ConcurrencyScope, FairShare
from workflows.entity_types import GateState, gate_workflow_id, key_run
from workflows.status import ConditionType, Phase

TEAM = ConcurrencyScope(key="team/ksquad-system/payments-squad", limit=1)
PROJECT = ConcurrencyScope(key="project/ksquad-system/payments-api", limit=2)


async def gate(client: Client, scope: ConcurrencyScope) -> GateState:
    handle = client.get_workflow_handle(gate_workflow_id(scope.key))
    state: GateState = await handle.query("state_query", result_type=GateState)
    return state


@pytest.mark.parametrize("first_ends", ["succeeds", "fails", "is cancelled"])
async def test_queued_run_is_admitted_when_the_holder_finishes_however_it_ends(
    client: Client, world: World, first_ends: str
) -> None:
    world.scopes["first"] = world.scopes["second"] = [TEAM, PROJECT]
    world.scripts["first"] = [failed(blocks=True) if first_ends == "fails" else block()]
    first = await start_run(client, run_input("first", retryPolicy={"maxRetries": 0}))
    await world.wait_entered(Activity.INVOKE_AGENT, "first")
    second = await start_run(client, run_input("second"))
    queued = await world.until_phase("second", "Queued")
    assert queued.reason == "ConcurrencyLimit"
    assert "team/ksquad-system/payments-squad is full (1); position 1" in (queued.message or "")
    admitted = queued.condition(ConditionType.ADMITTED)
    assert admitted is not None
    assert admitted.status == "False"
    assert not world.calls_of(Activity.CLAIM_WORK_ITEM, "second"), "a queued run claims nothing"
    resolves = len(world.calls_of(Activity.RESOLVE_REFERENCES, "second"))

    if first_ends == "is cancelled":
        await first.signal("cancel", "make room")
    else:
        world.release("first")
    expected = {"succeeds": Phase.SUCCEEDED, "fails": Phase.FAILED, "is cancelled": Phase.CANCELLED}[
        first_ends
    ]
    assert (await first.result()).phase == expected

    status = await second.result()
    assert status.phase == Phase.SUCCEEDED
    assert len(world.calls_of(Activity.RESOLVE_REFERENCES, "second")) == resolves, "it waited without polling"
    for scope in (TEAM, PROJECT):
        state = await gate(client, scope)
        assert state.holders == []
        assert state.waiting == []


async def test_runs_within_the_limit_are_not_queued(client: Client, world: World) -> None:
    world.scopes["a"] = world.scopes["b"] = [PROJECT]
    world.scripts["a"] = [block()]
    world.scripts["b"] = [block()]
    a = await start_run(client, run_input("a"))
    b = await start_run(client, run_input("b"))
    await world.wait_entered(Activity.INVOKE_AGENT, "a")
    await world.wait_entered(Activity.INVOKE_AGENT, "b")
    holders = (await gate(client, PROJECT)).holders
    assert sorted(key_run(key)[0] for key in holders) == ["ksquad-system/a", "ksquad-system/b"]
    world.release("a")
    world.release("b")
    for handle in (a, b):
        assert (await handle.result()).phase == Phase.SUCCEEDED
    assert "Queued" not in world.phases("a") + world.phases("b")


async def test_a_shared_queue_admits_round_the_teams_by_weight_not_in_arrival_order(
    client: Client, world: World
) -> None:
    """A Project's one slot: Team A queues six runs before Team B queues three; B's first goes after A's first
    (on a tie the later arrival goes first), and with weight 2 A gets two slots to B's one while both wait."""
    one = ConcurrencyScope(key="project/ksquad-system/shared", limit=1)
    world.scopes["holder"] = [one]
    world.scripts["holder"] = [block()]
    holder = await start_run(client, run_input("holder"))
    await world.wait_entered(Activity.INVOKE_AGENT, "holder")
    runs = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(3)]
    handles = []
    for run in runs:
        world.scopes[run] = [one]
        world.shares[run] = FairShare(tenant=f"team/{run[0]}", weight=2 if run[0] == "a" else 1)
        handles.append(await start_run(client, run_input(run)))
        await world.until_phase(run, "Queued")  # in this order
    b0 = world.last("b0")
    assert b0 is not None
    assert "position 2" in (b0.message or ""), b0.message
    world.release("holder")
    for handle in [holder, *handles]:
        assert (await handle.result()).phase == Phase.SUCCEEDED
    admitted = [c.run for c in world.calls_of(Activity.INVOKE_AGENT) if c.run != "holder"]
    assert admitted == ["a0", "b0", "a1", "a2", "b1", "a3", "a4", "b2", "a5"]


async def test_a_queued_run_paused_and_resumed_asks_again_and_is_admitted(
    client: Client, world: World
) -> None:
    """A pause while Queued withdraws the run's place; after `resume` it asks again, and the gate takes that as a
    new request (before, it refused it as a copy of the one withdrawn, and the run waited out queuedSeconds). The
    gate remembers the newest request given up: a copy of it or of any before it is refused."""
    world.scopes["holder"] = world.scopes["waiter"] = [TEAM]
    world.scripts["holder"] = [block()]
    holder = await start_run(client, run_input("holder"))
    await world.wait_entered(Activity.INVOKE_AGENT, "holder")
    waiter = await start_run(client, run_input("waiter"))
    await world.until_phase("waiter", "Queued")
    for round_ in range(2):  # twice: each withdrawal is remembered as its own
        await waiter.signal("pause", f"hold {round_}")
        await world.until_phase("waiter", "Paused")
        assert (await gate(client, TEAM)).waiting == []
        await waiter.signal("resume")
        await world.until_phase("waiter", "Queued")
        assert [key_run(k)[0] for k in (await gate(client, TEAM)).waiting] == ["ksquad-system/waiter"]
    world.release("holder")
    assert (await holder.result()).phase == Phase.SUCCEEDED
    assert (await waiter.result()).phase == Phase.SUCCEEDED
    state = await gate(client, TEAM)
    assert (state.holders, state.waiting) == ([], [])
    [key] = [k for k in state.released if key_run(k)[0] == "ksquad-system/waiter"]
    assert state.released_asks[key] == 3, "two places withdrawn, then the slot of its third request released"
