"""RunWorkflow's lifecycle on the time-skipping test server, one test per edge of DESIGN.md."""

from temporalio.client import Client

from tests.workflows.world import World, ok, run_input, start_run
from workflows.activity_types import Activity
from workflows.status import Phase


async def test_happy_path_claims_runs_publishes_and_releases(client: Client, world: World) -> None:
    world.scripts["fix-flaky-tests"] = [ok(summary="stabilized")]
    handle = await start_run(client, run_input("fix-flaky-tests", work_item_ref="wi-8123"))
    status = await handle.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.outputs == {"summary": "stabilized"}
    assert status.attempt == 1
    assert status.retries == 0
    assert world.order("fix-flaky-tests") == [
        "resolve_references",
        "claim_work_item",
        "acquire_sandbox",
        "invoke_agent",
        "publish_outputs",
        "release_sandbox",
        "release_work_item",
    ]
    assert not world.claims
    assert not world.sandboxes
    (call,) = world.calls_of(Activity.INVOKE_AGENT)
    assert call.detail["message_id"] == "uid-fix-flaky-tests-a1"
    phases = [s.phase for s in world.mirrored["fix-flaky-tests"]]
    assert phases[-1] == Phase.SUCCEEDED
