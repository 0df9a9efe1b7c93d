"""A Google ADK agent served over A2A by ADK's own `to_a2a`, its model any OpenAI-compatible server through LiteLLM
(ADK's way to models other than Gemini).

    python google_adk_a2a.py HOST PORT MODEL_BASE_URL MODEL_NAME   (OPENAI_API_KEY: the model's key)
"""

import logging
import os
import sys

import uvicorn
from google.adk.a2a.utils.agent_to_a2a import to_a2a
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm

logging.basicConfig(level=logging.WARNING)
host, port, base_url, model_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
model = LiteLlm(
    model=f"openai/{model_name}", api_base=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "none"
)
agent = LlmAgent(name="adk_agent", model=model, instruction="You answer briefly.")
app = to_a2a(agent, host=host, port=port)
uvicorn.run(app, host=host, port=port, log_level="warning")
