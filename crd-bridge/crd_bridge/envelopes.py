"""The bridge's side of the envelope (workflows.envelope): it seals each Run's start input, records which
execution of the Run's workflow it started, and resolves and mirrors for that execution only.

The record is the Run's own `status.workflow.firstRunId`, which only the bridge writes (the status subresource;
no built-in role grants it, and an admission policy keeps it unchanged once set): the first run id of the
workflow chain the bridge started, as the Temporal server named it. The embedded stack keeps the same field in
its stored statuses. A workflow asking for the Run's resolution, or writing its status, is checked against it:

- its envelope is one the bridge sealed, for the workflow id it runs under (a copy under another id: refused);
- its Run still exists with the envelope's uid (an envelope of a deleted Run resolves nothing);
- its execution, as the server says (the activity's own workflow and run, `temporal_client.chains`), is the one
  recorded, or the first to ask when none is recorded yet (the start response records it at once): a copy
  started under the same id after the Run's workflow closed is another execution, and refused.

A refusal is visible three ways: a Warning Event on the Run (`CopyRefused`, naming the workflow and run), the
counter `ksquad_copies_refused_total{activity}`, and a log line; the copy's own activity fails for good.
"""

import logging
from dataclasses import dataclass

from prometheus_client import Counter
from temporalio import activity
from temporalio.exceptions import ApplicationError

from temporal_client.chains import Chains, ChainUnknown
from temporal_client.seal import Copied, Sealer, Unsealed
from workflows.activity_types import COPY_REFUSED, UNSEALED
from workflows.envelope import RunEnvelope

log = logging.getLogger(__name__)

COPIES_REFUSED = Counter(
    "ksquad_copies_refused", "bridge activities refused to a copy of a Run's workflow", ["activity"]
)


@dataclass(frozen=True)
class Execution:
    """The workflow execution an activity runs for, as the server says."""

    workflow_id: str
    run_id: str

    @classmethod
    def current(cls) -> "Execution":
        info = activity.info()
        return cls(info.workflow_id or "", info.workflow_run_id or "")


def refusal(err: Unsealed) -> ApplicationError:
    kind = COPY_REFUSED if isinstance(err, Copied) else UNSEALED
    return ApplicationError(str(err), type=kind, non_retryable=True)


def check_envelope(sealer: Sealer | None, envelope: RunEnvelope, execution: Execution) -> None:
    """Raises Unsealed (not the bridge's) or Copied (under another workflow id). Without a sealer (tests of the
    bridge's own activities) nothing is checked."""
    if sealer is not None:
        sealer.check_envelope(envelope, execution.workflow_id)


async def execution_chain(chains: Chains | None, execution: Execution, recorded: str | None) -> str:
    """The first run id of the execution's chain (its run's own id when it has not continued as new). Without
    `chains` (tests of the bridge's activities alone, no Temporal to ask), the run's own id."""
    if chains is None:
        return execution.run_id
    try:
        return await chains.of(execution.workflow_id, execution.run_id, expected=recorded)
    except ChainUnknown as err:
        raise ApplicationError(str(err), type="TemporalUnavailable") from None


def check_chain(run: str, recorded: str | None, chain: str, execution: Execution) -> None:
    if recorded is not None and chain != recorded:
        raise Copied(
            f"workflow {execution.workflow_id} run {execution.run_id} (execution {chain}) is not the execution "
            f"the bridge started for Run {run} ({recorded}): a copy of the Run's start input, refused"
        )


def counted(activity_name: str, err: Unsealed, execution: Execution) -> None:
    COPIES_REFUSED.labels(activity_name).inc()
    log.warning(
        "refused %s to workflow %s run %s: %s", activity_name, execution.workflow_id, execution.run_id, err
    )
