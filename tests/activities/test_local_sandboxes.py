"""The embedded default's sandboxes: the reference agent as a local process on a loopback address."""

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.agents import AgentActivities
from activities.sandboxes import LocalModel, LocalSandboxes, SandboxActivities, SandboxSettings
from store import Store
from testbed import warrants
from testbed.agents import MODEL_KEY, ModelEndpoint, contract


async def test_a_local_sandbox_runs_the_agent_and_is_gone_after_release(
    model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "done locally"})
    c = contract(model, work_item_ref=None)
    assert c.model.credential is not None
    backend = LocalSandboxes(
        SandboxSettings(backend="local"),
        LocalModel(model.url, c.model.credential, MODEL_KEY),
        log_dir=tmp_path,
    )
    acts = SandboxActivities(backend)
    sandbox = await ActivityEnvironment().run(acts.acquire_sandbox, warrants.sandbox_request(c, 30))
    assert sandbox.kind == "local"
    assert sandbox.endpoint.startswith("http://127.0.0.1:")
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        inv = warrants.invocation(c, sandbox)
        result = await ActivityEnvironment().run(AgentActivities(store).invoke_agent, inv)
    finally:
        await store.close()
    assert result.outputs == {"answer": "done locally"}
    process = backend.processes[sandbox.name]
    await ActivityEnvironment().run(
        acts.release_sandbox,
        warrants.sandbox_release(c, sandbox, confirm=True),
    )
    assert process.returncode is not None, "the agent process ended"
    assert (tmp_path / "payments_r-exec-1.log").is_file()
