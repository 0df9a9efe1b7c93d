"""The names a Run's workflow answers to: its signals and its query. The bridge, the embedded stack, its API, the
CLI and the entity workflows send these; RunWorkflow handles each under the same name."""

from enum import StrEnum


class RunSignal(StrEnum):
    # from users (the CLI, the dev API, the bridge's annotations, kubectl delete)
    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    INPUT = "input"
    # from the bridge
    CREDENTIAL_REFRESHED = "credential_refreshed"
    REFERENCES_UPDATED = "references_updated"
    # from the entity workflows (workflows.entities)
    CREDENTIAL_THROTTLED = "credential_throttled"
    SLOT_GRANTED = "slot_granted"
    SLOT_QUEUED = "slot_queued"


# What `ksquad runs cancel|pause|resume|input` and the dev API's signal route send.
USER_SIGNALS = (RunSignal.CANCEL, RunSignal.PAUSE, RunSignal.RESUME, RunSignal.INPUT)

# The query that answers a Run's current status.
STATE_QUERY = "state"
