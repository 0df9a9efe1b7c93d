"""Which execution a workflow run belongs to, as the Temporal server says.

A workflow id names many executions over time: a Run deleted and created again under its old name, or a copy of
a Run's start input started by someone else once the original closed. Temporal groups the runs of one execution
(continue-as-new, a retry, a reset) into a chain named by its first run id, and says which chain a run is in
(`first_run_id` in the run's description). The bridge records the chain it started for each Run, and the worker
and the bridge act for no other (temporal_client.seal's warrants are bound to it).
"""

from collections import OrderedDict

from temporalio.client import Client
from temporalio.service import RPCError

CHAINS_CACHED = 10_000  # runs whose chain is remembered (one describe each, the first time)


class ChainUnknown(Exception):
    """The server would not say which execution a run belongs to."""


class Chains:
    def __init__(self, client: Client, size: int = CHAINS_CACHED) -> None:
        self.client = client
        self.size = size
        self._known: OrderedDict[tuple[str, str], str] = OrderedDict()

    async def of(self, workflow_id: str, run_id: str, expected: str | None = None) -> str:
        """The first run id of the chain `run_id` is in. A run that is the `expected` chain's first run needs no
        question to the server: the server named it the activity's run, and it is that chain's start."""
        if expected is not None and run_id == expected:
            return run_id
        key = (workflow_id, run_id)
        chain = self._known.get(key)
        if chain is not None:
            self._known.move_to_end(key)
            return chain
        try:
            described = await self.client.get_workflow_handle(workflow_id, run_id=run_id).describe()
        except RPCError as err:
            raise ChainUnknown(f"describing {workflow_id} run {run_id}: {err.message}") from None
        chain = described.raw_description.workflow_execution_info.first_run_id or run_id
        self._known[key] = chain
        if len(self._known) > self.size:
            self._known.popitem(last=False)
        return chain

    async def current(self, workflow_id: str) -> tuple[str, str, bool] | None:
        """(run id, chain, closed) of the newest run under `workflow_id`; None when there is none."""
        try:
            described = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status.name == "NOT_FOUND":
                return None
            raise
        info = described.raw_description.workflow_execution_info
        run_id = info.execution.run_id
        return run_id, info.first_run_id or run_id, described.close_time is not None
