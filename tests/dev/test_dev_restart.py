"""`ksquad dev` killed (SIGKILL) or stopped (Ctrl-C) in the middle of a run and started again: the run
finishes, once.

The model here is the test's own scripted server (`OPENAI_BASE_URL`), so it outlives the stack as a real
provider would; the local agent outlives it too, as a sandbox Job outlives a worker pod."""

import asyncio
from pathlib import Path

import pytest
import yaml
from temporalio.client import Client

from testbed.agents import ModelEndpoint
from testbed.isolate import free_port
from tests.support.dev import DevProcess

DOCS = [
    {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "steady"},
        "spec": {"modelEndpointRef": "local"},
    },
    {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "survivor"},
        "spec": {"agents": ["steady"], "model": "thoughtful", "inputs": {"task": "outlive the crash"}},
    },
]


@pytest.mark.parametrize("stop", ["SIGKILL", "Ctrl-C"])
async def test_dev_stopped_mid_run_and_restarted_finishes_the_run_and_nothing_runs_twice(
    model: ModelEndpoint, tmp_path: Path, stop: str
) -> None:
    model.script("thoughtful", {"delay": 6, "text": "answered once"})
    dev = DevProcess(
        tmp_path,
        env={"OPENAI_BASE_URL": model.url, "OPENAI_API_KEY": "sk-test-dev"},
        api_port=free_port("127.0.0.1"),  # where the watch below finds the restarted stack
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump_all(DOCS))
    await dev.start()
    try:
        assert (await dev.cli("run", "-f", str(tmp_path / "run.yaml"))).code == 0
        # A watch that outlives the stack: it resumes from its last event when the API is back (Last-Event-ID).
        watching = asyncio.create_task(dev.cli("runs", "watch", "survivor", "-o", "json", timeout=240))
        await dev.wait_phase("survivor", {"Running"})
        for _ in range(100):  # until the agent is waiting on the model
            if model.state.in_flight:
                break
            await asyncio.sleep(0.1)
        assert model.state.in_flight == 1

        if stop == "SIGKILL":
            dev.kill()
            assert dev.process is not None
            await dev.process.wait()
        else:
            assert await dev.stop() == 0, "Ctrl-C stops it cleanly"
        assert len(dev.leftover_agents()) == 1, "the run's agent goes on without the stack"

        await dev.start()
        run = await dev.wait_phase("survivor", {"Succeeded", "Failed", "Cancelled"}, within=150)
        status = run["status"]
        assert status["phase"] == "Succeeded", status
        assert status["outputs"] == {"answer": "answered once"}, status
        assert status["attempt"] == 1, "the attempt in flight was resumed, not repeated"
        assert [c.model for c in model.state.calls] == ["thoughtful"], "the model was asked once"

        resumed = await watching
        assert resumed.code == 0, resumed.err
        phases = [
            e["data"]["phase"] for e in map(yaml.safe_load, resumed.out.splitlines()) if e["kind"] == "phase"
        ]
        assert phases == ["Pending", "Claiming", "Running", "Succeeded"], "each once, across the restart"
        watched = await dev.cli("runs", "watch", "survivor", "-o", "json")
        phases = [
            e["data"]["phase"] for e in map(yaml.safe_load, watched.out.splitlines()) if e["kind"] == "phase"
        ]
        assert phases == ["Pending", "Claiming", "Running", "Succeeded"], phases

        temporal = await Client.connect(dev.info["temporal"])
        executions = [w async for w in temporal.list_workflows('WorkflowId = "default/survivor"')]
        assert len(executions) == 1, "one workflow for the run, across both lives of the stack"
        assert not dev.leftover_agents(), "the sandbox of the finished run is released"
    finally:
        await dev.stop()
        dev.kill_leftover_agents()
