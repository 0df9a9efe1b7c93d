"""Fixtures of the bridge tests: ksquad deployed as the chart does it (testbed.stack)."""

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from dev.devserver import DevServer
from kube import Config, Kube
from testbed.agents import ModelEndpoint
from testbed.controlplane import ControlPlane
from testbed.stack import RUN_API, RUNC_FOR_GVISOR, Stack, build_stack

__all__ = ["RUN_API", "Stack", "StackFactory"]

StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def start_stack(
    ksquad_cluster: ControlPlane, dev_server: DevServer, model: ModelEndpoint, tmp_path: Path
) -> AsyncIterator[StackFactory]:
    """`await start_stack(namespace)`: the chart's RBAC applied for `namespace`, bridge and worker running, the
    Runs' sandboxes on runc (testbed.stack.RUNC_FOR_GVISOR) unless `gvisor=True`."""
    stacks: list[Stack] = []
    async with Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as admin:

        async def start(namespace: str | None = None, bridge: bool = True, gvisor: bool = False) -> Stack:
            runtimes = None if gvisor else RUNC_FOR_GVISOR
            stack = await build_stack(
                ksquad_cluster, dev_server, model, admin, tmp_path, namespace, bridge, runtimes
            )
            stacks.append(stack)
            return stack

        try:
            yield start
        finally:
            for stack in stacks:
                stack.stop()
