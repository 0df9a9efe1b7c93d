"""A pydantic-ai agent served over A2A by FastA2A (`fasta2a.pydantic_ai.agent_to_a2a`), its model any
OpenAI-compatible server.

    python pydantic_ai_fasta2a.py HOST PORT MODEL_BASE_URL MODEL_NAME   (OPENAI_API_KEY: the model's key)
"""

import logging
import os
import sys

import uvicorn
from fasta2a.pydantic_ai import agent_to_a2a
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

logging.basicConfig(level=logging.INFO)  # the worker's failures, in the log the test shows
host, port, base_url, model_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
provider = OpenAIProvider(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "none")
agent = Agent(OpenAIChatModel(model_name, provider=provider), instructions="You answer briefly.")
app = agent_to_a2a(agent, name="pydantic-ai-agent", url=f"http://{host}:{port}/")
uvicorn.run(app, host=host, port=port, log_level="warning")
