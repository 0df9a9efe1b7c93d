"""A Run's workflow (`workflow.RunWorkflow`), split by the state each part owns (see workflow.py's docstring)."""

from workflows.run.state import RunCarry, RunInput
from workflows.run.workflow import RunWorkflow

__all__ = ["RunCarry", "RunInput", "RunWorkflow"]
