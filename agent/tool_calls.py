"""The tools a task's model is offered, and running the calls its turns make: the Agent's MCP tools (agent.tools'
ToolBox), the agent's own `ksquad_request_input` (the model asks the user: the task pauses, INPUT_REQUIRED) and,
with squad memory, `ksquad_remember` (agent.memory). A call is recorded in the attempt's journal before it runs and
its result after, and each is reported as it starts and as it answers."""

import json

from agent.conversation import Conversation
from agent.memory import REMEMBER, remember, remember_tool
from agent.model import ToolCall
from agent.reports import Reports
from agent.spans import tool_answered, tool_span
from agent.tools import ToolBox, ToolResult

ASK_USER = "ksquad_request_input"  # the agent's own tool: the model asks the user a question

ASK_USER_TOOL = {
    "type": "function",
    "function": {
        "name": ASK_USER,
        "description": "Ask the person who started the run a question, when you cannot go on without the answer.",
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        },
    },
}


class ToolCalls:
    """One task's tools: their definitions for the model, and the calls of its turns run in order."""

    def __init__(self, conversation: Conversation, reports: Reports, tools: ToolBox) -> None:
        self.conversation = conversation
        self.reports = reports
        self.tools = tools
        self.definitions = [*tools.definitions(), ASK_USER_TOOL]
        api = conversation.contract.attempt_api
        if api is not None and api.memory:
            self.definitions.append(remember_tool(api))

    async def run(self, calls: list[ToolCall]) -> bool:
        """Run the calls, each answered in the conversation; False when one asks the user (the task now waits
        for the answer, INPUT_REQUIRED, and the calls after it are not run)."""
        conversation, reports, journal = self.conversation, self.reports, self.conversation.journal
        contract = conversation.contract
        api = contract.attempt_api
        for call in calls:
            if call.name == ASK_USER:
                await journal.flush()  # the turn that asks is recorded before the question goes out
                conversation.pending_question = call.id
                question = _argument(call.arguments, "question") or "The agent needs input."
                await reports.requires_input(question)
                return False
            await reports.working(f"calling tool {call.name}", {"ksquad.io/tool": call.name})
            journal.add(conversation.turns, "tool-started", {"id": call.id, "name": call.name})
            await journal.flush()  # a retry knows the call may have taken effect
            with tool_span(call.name, call.id, call.arguments) as span:
                if call.name == REMEMBER and api is not None and api.memory:
                    text, failed = await remember(api, contract.run.namespace, call.arguments)
                    result = ToolResult(text, failed)
                else:
                    result = await self.tools.call(call.name, call.arguments)
                tool_answered(span, result.text, result.is_error)
            message = {"role": "tool", "tool_call_id": call.id, "content": result.text}
            conversation.messages.append(message)
            journal.add(conversation.turns, "tool", {"message": message})
            await reports.working(
                f"{call.name}: {result.text[:200]}",
                {"ksquad.io/tool": call.name, "ksquad.io/tool-error": result.is_error},
            )
        return True


def _argument(arguments: str, name: str) -> str:
    try:
        value = json.loads(arguments or "{}").get(name)
    except (json.JSONDecodeError, AttributeError):
        return ""
    return str(value) if value is not None else ""
