"""Record the histories the replay test checks: `python -m tests.workflows.record_histories vN [scenario...]`.

Each scenario is one of the lifecycle tests, run against a fresh time-skipping server; the histories of every
workflow it ran (runs, credential throttles, gates) are written to tests/workflows/histories/vN/<scenario>/.
Histories of released versions stay: they are what running workflows look like when new code is deployed, and
every one of them must keep replaying (after a release, changes that alter commands are guarded by a patch:
workflows.patches; docs/operating.md). v1 is 0.1.0, the baseline. Record a new version after each such change.
"""

import asyncio
import inspect
import json
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from testbed.temporal import start_time_skipping
from tests.workflows import (
    test_run_cancel,
    test_run_lifecycle,
    test_run_pauses,
    test_run_queue,
    test_run_rate_limits,
)
from tests.workflows.world import WORLD_KEY, World, running_world
from workflows.entity_types import credential_workflow_id, gate_workflow_id

HISTORIES = Path(__file__).with_name("histories")
# The world's key of the recording, beside its histories: the signals in them carry proofs made with it, and a
# replay checks them as the worker did (a test key of one recording, no deployment's).
SIGNAL_KEY_FILE = "signal-key.hex"
NAMESPACE = "ksquad-system"

SCENARIOS: dict[str, tuple[Callable[..., Awaitable[None]], dict[str, Any]]] = {
    "happy-path": (test_run_lifecycle.test_happy_path_claims_runs_publishes_and_releases, {}),
    "retry-then-success": (test_run_lifecycle.test_agent_failure_retries_after_backoff_then_succeeds, {}),
    "retries-exhausted": (
        test_run_lifecycle.test_max_retries_exhausted_fails_the_run_after_two_retries_by_default,
        {},
    ),
    "sandbox-death": (test_run_lifecycle.test_sandbox_death_fences_before_releasing_then_retries, {}),
    "references-missing": (test_run_lifecycle.test_missing_references_are_named_waited_for_and_picked_up, {}),
    "fallback-model": (test_run_rate_limits.test_fallback_model_switches_mid_run_without_pausing, {}),
    "retry-after-pause": (
        test_run_rate_limits.test_retry_after_seconds_pauses_until_resume_at_with_no_calls_meanwhile,
        {},
    ),
    "reroute": (test_run_rate_limits.test_repeated_limits_reroute_to_the_next_eligible_agent, {}),
    "shared-credential": (
        test_run_rate_limits.test_runs_sharing_a_credential_pause_together_others_keep_running,
        {},
    ),
    "credential-expired": (
        test_run_pauses.test_credential_expired_waits_then_resumes_the_same_task_on_refresh,
        {},
    ),
    "input-required": (test_run_pauses.test_input_required_resumes_with_the_input, {}),
    "manual-pause": (
        test_run_pauses.test_manual_pause_stops_the_agent_keeps_the_claim_and_resume_starts_a_new_attempt,
        {},
    ),
    "queued": (
        test_run_queue.test_queued_run_is_admitted_when_the_holder_finishes_however_it_ends,
        {"first_ends": "succeeds"},
    ),
    "cancel-running-temporal": (
        test_run_cancel.test_cancel_from_every_phase_tears_down_and_leaks_nothing,
        {"phase": "Running", "how": "temporal-cancel"},
    ),
    "cancel-paused-signal": (
        test_run_cancel.test_cancel_from_every_phase_tears_down_and_leaks_nothing,
        {"phase": "Paused(RateLimited)", "how": "cancel-signal"},
    ),
}


def workflow_ids(world: World) -> list[str]:
    ids = [f"{NAMESPACE}/{run}" for run in world.mirrored]
    secrets = {a.model.credential.secret_name for a in world.agents.values() if a.model.credential}
    ids += [credential_workflow_id(f"{NAMESPACE}/{secret}") for secret in sorted(secrets)]
    ids += sorted({gate_workflow_id(s.key) for scopes in world.scopes.values() for s in scopes})
    return ids


async def record(version: str, name: str) -> list[str]:
    test, kwargs = SCENARIOS[name]
    env = await start_time_skipping()
    world = World()
    written = []
    try:
        async with running_world(env, world) as client:
            await test(client=client, world=world, **kwargs)
            written = await dump(client, world, HISTORIES / version / name)
    finally:
        await env.shutdown()
    return written


async def dump(client: Client, world: World, folder: Path) -> list[str]:
    histories = {}
    for workflow_id in workflow_ids(world):
        try:
            history = await client.get_workflow_handle(workflow_id).fetch_history()
        except RPCError:
            continue  # that entity was never started in this scenario
        histories[workflow_id.replace("/", "__") + ".json"] = json.dumps(
            history.to_json_dict(), sort_keys=True
        )
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, text in histories.items():
        (folder / name).write_text(text + "\n")
    (folder / SIGNAL_KEY_FILE).write_text(WORLD_KEY.hex() + "\n")
    return list(histories)


async def main(version: str, names: list[str]) -> None:
    for name in names or list(SCENARIOS):
        files = await record(version, name)
        print(f"{version}/{name}: {', '.join(files)}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1].startswith("v"):
        sys.exit("usage: python -m tests.workflows.record_histories vN [scenario ...]")
    assert all(inspect.iscoroutinefunction(t) for t, _ in SCENARIOS.values())
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
