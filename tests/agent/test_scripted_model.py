"""The scripted model server speaks OpenAI's API to the real `openai` client: models, text and tool calls,
streamed and not, and is scriptable over HTTP."""

import httpx
import openai

from testbed.agents import ModelEndpoint


async def test_models_text_and_tool_calls_streamed_and_not(model: ModelEndpoint) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            model.url.removesuffix("/v1") + "/_script",
            json={
                "models": {
                    "m1": [
                        {"text": "hello there"},
                        {"tool_calls": [{"name": "add_note", "arguments": {"text": "x"}}]},
                    ],
                }
            },
        )
        assert response.json() == {"models": ["m1"]}
    client = openai.AsyncOpenAI(base_url=model.url, api_key="sk-1", max_retries=0)
    assert [m.id async for m in client.models.list()] == ["m1"]
    first = await client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
    assert first.choices[0].message.content == "hello there"
    stream = await client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    calls: dict[int, list[str]] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, ["", ""])
                entry[0] += (d.function.name or "") if d.function else ""
                entry[1] += (d.function.arguments or "") if d.function else ""
    assert calls == {0: ["add_note", '{"text": "x"}']}
    unscripted = await client.chat.completions.create(
        model="other", messages=[{"role": "user", "content": "hi"}]
    )
    assert unscripted.choices[0].message.content == "Done: the task is complete."
    await client.close()
    assert [(c.model, c.stream) for c in model.state.calls] == [("m1", False), ("m1", True), ("other", False)]
    assert model.state.calls[0].credential != "sk-1", "credentials are recorded as fingerprints only"
