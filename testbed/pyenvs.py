"""Python programs of the field (MCP servers, mcp-proxy, other frameworks' agents, a model server), each in a
virtualenv of its own: their pins never meet ksquad's (another `mcp`, another `a2a-sdk`), and what they import is
what a user who runs them has. Built once from PyPI into a cache outside the clone, keyed by the pinned
requirements (and this Python), and reused after; a build that fails says which pins and why.

    bin_dir = field_env("mcp-servers", MCP_SERVERS)   # .../bin, with the packages' commands in it
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The MCP servers users deploy from the reference servers, and the proxy that serves a stdio server on
# streamable HTTP and SSE (https://github.com/sparfenyuk/mcp-proxy): apart, as it pins mcp<2 and they mcp>=2.3.
MCP_SERVERS = ("mcp-server-time==2026.10.19", "mcp-server-git==2026.10.19")
MCP_PROXY = ("mcp-proxy==0.13.0",)
# Agents of other frameworks (testbed/field_agents/): pydantic-ai served by FastA2A.
PYDANTIC_AI = ("fasta2a[pydantic-ai]==2.1.1", "pydantic-ai-slim[openai]==2.78.0", "uvicorn==0.55.0")
# Google ADK served by its own to_a2a, its models through LiteLLM.
GOOGLE_ADK = ("google-adk[a2a]==2.13.0", "litellm==1.110.2")
# A LangGraph graph behind a2a-sdk's server (the A2A adapter of a2a-samples' LangGraph agent), human in the loop.
LANGGRAPH = ("langgraph==1.2.24", "langchain-openai==1.8.1", "a2a-sdk[http-server]==1.3.0", "uvicorn==0.55.0")


class FieldEnvError(Exception):
    pass


def cache_root() -> Path:
    root = os.environ.get("KSQUAD_TESTBINS_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ksquad-testbins"
    )
    return Path(root)


def field_env(name: str, requirements: tuple[str, ...], timeout: float = 1800) -> Path:
    """The bin directory of a virtualenv holding `requirements` (exact pins), built if missing. One builder at a
    time per environment (pytest's workers may ask together): the second waits, then finds it built."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256("\n".join((version, *sorted(requirements))).encode()).hexdigest()[:12]
    root = cache_root() / f"pyenv-{name}-py{version}-{key}"
    done = root / ".built"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _build(root, requirements, timeout)
            done.write_text("\n".join(requirements) + "\n")
    return root / "bin"


def _build(root: Path, requirements: tuple[str, ...], timeout: float) -> None:
    shutil.rmtree(root, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(root)],
        [
            str(root / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
    ]
    for step in steps:
        try:
            built = subprocess.run(step, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FieldEnvError(f"{' '.join(step[:4])}: not done in {timeout:.0f} s") from None
        if built.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise FieldEnvError(
                f"building the environment of {', '.join(requirements)} failed (exit {built.returncode}):\n"
                f"{built.stderr[-4000:]}"
            )


FIELD_ENVS = {
    "mcp-servers": MCP_SERVERS,
    "mcp-proxy": MCP_PROXY,
    "pydantic-ai": PYDANTIC_AI,
    "google-adk": GOOGLE_ADK,
    "langgraph": LANGGRAPH,
}


if __name__ == "__main__":  # `make testbins`: every environment, built when missing
    for env_name, pins in FIELD_ENVS.items():
        field_env(env_name, pins)
