"""The fair ramp after a credential's limit (store.ramps) on real PostgreSQL and SQLite: turns go round the Teams
that wait, by weight, never faster than the ramp's rate, and a Team that arrives late is not put behind the
backlog of one that came first."""

from datetime import datetime, timedelta

import sqlalchemy as sa

from store import Store
from store.schema import resume_ramps
from tests.activities.conftest import Clock

RATE = 10.0  # resumePerSecond


async def waiting_turn(store: Store, opens: datetime, run: str, tenant: str, weight: float = 1) -> datetime:
    """A run's turn in the ramp "ramp" (not released yet: its turn is still to come)."""
    turn = await store.take_turn("ramp", opens, RATE, run, tenant, weight)
    assert turn is not None, f"{run} was released"
    return turn


async def test_a_small_team_interleaves_with_a_large_one_instead_of_waiting_behind_it(
    store: Store, clock: Clock
) -> None:
    opens = clock.now + timedelta(seconds=30)
    turns = {}
    for i in range(100):
        turns[f"a-{i}"] = await waiting_turn(store, opens, f"a-{i}", "team/a")
    for i in range(10):
        turns[f"b-{i}"] = await waiting_turn(store, opens, f"b-{i}", "team/b")
    slot = timedelta(seconds=1 / RATE)
    assert [turns[f"b-{i}"] for i in range(10)] == [opens + 2 * i * slot for i in range(10)], (
        "B's k-th run goes right before A's k-th (the later arrival first on a tie), not after A's hundred"
    )
    # A turn given before B came is moved back when its run wakes and asks again (as the workflow does).
    now = {run: await waiting_turn(store, opens, run, f"team/{run[0]}") for run in turns}
    assert now["a-99"] == opens + 109 * slot
    assert sorted(now.values()) == [opens + i * slot for i in range(110)], "every run has a slot of its own"
    again = await store.take_turn("ramp", opens, RATE, "b-3", "team/b", 1)
    assert again == turns["b-3"], "asking again (a retried activity) finds the run where it is"


async def test_weights_share_the_turns_two_to_one(store: Store, clock: Clock) -> None:
    opens = clock.now + timedelta(seconds=30)
    runs = [(f"{team}-{i}", team, weight) for i in range(60) for team, weight in (("heavy", 2), ("light", 1))]
    for run, team, weight in runs:  # entered in turn: each Team has the same number waiting
        await store.take_turn("ramp", opens, RATE, run, f"team/{team}", weight)
    now = [(team, await waiting_turn(store, opens, run, f"team/{team}", w)) for run, team, w in runs]
    first_sixty = [team for team, _ in sorted(now, key=lambda t: t[1])][:60]
    assert first_sixty.count("heavy") == 40 and first_sixty.count("light") == 20


async def test_late_arrivals_move_waiting_runs_back_and_the_rate_holds(store: Store, clock: Clock) -> None:
    """A simulated ramp: each run wakes at its turn and asks again; B's runs arrive a second into it."""
    opens = clock.now + timedelta(seconds=5)
    known = {f"a-{i}": await store.take_turn("ramp", opens, RATE, f"a-{i}", "team/a", 1) for i in range(40)}
    tenants = dict.fromkeys(known, "team/a")
    released: dict[str, float] = {}
    clock.now = opens
    step = 0.01
    while len(released) < 46:
        elapsed = (clock.now - opens).total_seconds()
        if abs(elapsed - 1.0) < step / 2:
            for i in range(6):
                run = f"b-{i}"
                tenants[run] = "team/b"
                known[run] = await store.take_turn("ramp", opens, RATE, run, "team/b", 1)
                if known[run] is None:
                    released[run] = elapsed
        for run, turn in list(known.items()):
            if run not in released and turn is not None and turn <= clock.now:
                known[run] = await store.take_turn("ramp", opens, RATE, run, tenants[run], 1)
                if known[run] is None:
                    released[run] = elapsed
        count = len(released)
        assert count <= int(elapsed * RATE + 1e-9) + 1, (
            f"{count} released {elapsed:.2f} s into a ramp of {RATE}/s"
        )
        clock.advance(step)
        assert elapsed < 10, f"the ramp never finished: {sorted(set(known) - set(released))} still wait"
    b_waits = sorted(released[f"b-{i}"] - 1.0 for i in range(6))
    assert b_waits[-1] <= 12 / RATE + step, f"B's six went within about twelve slots of arriving: {b_waits}"
    a_order = sorted((released[f"a-{i}"], i) for i in range(40))
    assert [i for _, i in a_order] == list(range(40)), "A's runs keep their order among themselves"
    assert max(released.values()) <= 46 / RATE + step, "no slot was left empty"


async def test_a_new_limit_starts_its_own_ramp_and_old_ramps_are_forgotten(
    store: Store, clock: Clock
) -> None:
    old = clock.now
    assert await store.take_turn("old", old, RATE, "a-0", "team/a", 1) is None, "the limit ended: go now"
    clock.advance(timedelta(days=2).total_seconds())
    opens = clock.now + timedelta(seconds=10)
    assert await store.take_turn("new", opens, RATE, "a-0", "team/a", 1) == opens
    async with store.engine.connect() as c:
        left = (await c.execute(sa.select(resume_ramps.c.ramp).distinct())).scalars().all()
    assert left == ["new"], "a ramp that ended a day ago is deleted when a new one starts"
