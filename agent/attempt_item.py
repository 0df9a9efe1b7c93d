"""What a task does with its attempt's work item (agent.work_item, the items API): reads the item and its record into
the conversation before the first model call (an open or blocked item is in progress from then), and leaves a note
on it when the attempt fails or finishes (the item done when it finished). The item is context: when it cannot be
read or commented on, the task says so and goes on."""

from agent.contract import Contract, WorkItemAccess
from agent.conversation import Conversation
from agent.reports import Reports
from agent.work_item import WorkItemError, read_item, set_state
from agent.work_item import comment as comment_on_item

# The comment an attempt leaves on its work item when it finishes.
FINISHED = "finished: its answer is the Run's (its status and its artifact `answer`)"


async def read_work_item(access: WorkItemAccess, conversation: Conversation, reports: Reports) -> None:
    """The item and its record after the task: what earlier attempts, other agents and people said; an open
    or blocked item is in progress from now."""
    try:
        state, text = await read_item(access)
        conversation.item_state = state
        conversation.messages.append({"role": "user", "content": text})
        if state in ("open", "blocked"):
            await set_state(access, "in-progress")
    except WorkItemError as err:
        await reports.working(f"work item {access.namespace}/{access.id}: {err}: going on without it")


async def note_on_item(contract: Contract, what: str, reports: Reports, done: bool = False) -> None:
    """A comment on the attempt's work item saying how it went, and the item done if the attempt finished
    (nothing without an item)."""
    if contract.work_item is None:
        return
    run = contract.run
    try:
        await comment_on_item(
            contract.work_item, f"Attempt {run.attempt} of run {run.namespace}/{run.name} {what}"
        )
        if done:
            await set_state(contract.work_item, "done")
    except WorkItemError as err:  # a fenced-off attempt's comment is refused: its outcome still stands
        await reports.working(f"could not comment on the work item: {err}")
