"""Which code paths a Run's history was written with, at the cost of one marker a Run.

`workflow.patched(id)` is True for a workflow that runs the code now and False when replaying a history recorded
before the patch; each id a new workflow asks records a marker and the SDK's TemporalChangeVersion upsert: two
history events, every Run, for every patch there has ever been. A Run's history started by this code records
one marker, `CURRENT`, and takes every earlier patch's new path without asking it; a history recorded before
`CURRENT` has no such marker and asks each patch as it did when it ran (tests/workflows/test_replay.py replays one
of each version). A change that must replay differently adds its patch here as the next `CURRENT`: runs started
before it keep theirs.
"""

from temporalio import workflow

# Recorded by every Run started since tests/workflows/histories/v5: two events where the three patches a one-attempt
# Run asked were six (bench.actions).
CURRENT = "run-history-v5"


class Patches:
    """One workflow's answers to `workflow.patched`, through `CURRENT` first."""

    def __init__(self) -> None:
        self._current: bool | None = None

    def current(self) -> bool:
        """Whether this history was started by this code (asked once, at the run's start: its answer never moves
        within a history)."""
        if self._current is None:
            self._current = workflow.patched(CURRENT)
        return self._current

    def patched(self, patch_id: str) -> bool:
        """An earlier patch: its new path in a current history (no marker of its own), else as `workflow.patched`."""
        return self.current() or workflow.patched(patch_id)
