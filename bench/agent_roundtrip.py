"""The overhead of one agent round trip (invoke_agent: A2A to the reference agent, which calls the model),
against calling the scripted model directly with the same client code, measured in the same run.

    python -m bench.agent_roundtrip [--iterations N]
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from temporalio.testing import ActivityEnvironment

from activities.agents import AgentActivities, CallerKeys
from activities.agents.callers import process_keys
from agent.callers import ENDPOINT_KEY_ENV
from agent.contract import parse_contract
from agent.model import complete
from agent.scripted_model import ScriptedModel, build_app
from bench.stats import percentiles, report
from store import Store
from testbed import warrants
from testbed.asgi import serving
from testbed.isolate import free_port
from workflows.contract import CredentialRef, ExecutionContract, ModelRef, ResolvedAgent, RunIdentity


async def main(iterations: int) -> None:
    state = ScriptedModel()
    state.load({"models": {"bench-model": [{"text": "done"}]}})
    async with serving(build_app(state)) as model_url:
        credential = CredentialRef(secret_name="bench", allowed_hosts=[urlsplit(model_url).netloc])
        model = ModelRef(name="bench-model", url=f"{model_url}/v1", credential=credential)
        port = free_port()
        # One long-lived agent for every attempt: a shared endpoint, checking the tokens the worker signs.
        agent = ResolvedAgent(name="bench", model=model, endpoint=f"http://127.0.0.1:{port}/")
        base = ExecutionContract(
            run=RunIdentity(namespace="bench", name="r", uid="uid-bench", attempt=1, fence=1),
            inputs={"task": "say done"},
            agent=agent,
            model=model,
        )
        key_env = credential.env
        with tempfile.TemporaryDirectory() as tmp:
            endpoint_key = Path(tmp) / "endpoint.key"
            endpoint_key.write_bytes(os.urandom(32))
            (Path(tmp) / "secrets" / "bench" / "bench").mkdir(parents=True)
            (Path(tmp) / "secrets" / "bench" / "bench" / "apiKey").write_text("sk-bench")
            env = {**os.environ, ENDPOINT_KEY_ENV: str(endpoint_key), "KSQUAD_SECRETS_DIR": f"{tmp}/secrets"}
            process = subprocess.Popen(
                [sys.executable, "-m", "agent.server", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                await wait_ready(f"http://127.0.0.1:{port}/readyz")
                store = await Store.open(f"sqlite:///{Path(tmp) / 'bench.db'}")
                acts = AgentActivities(
                    store, keys=CallerKeys(process_keys().sandbox, endpoint_key.read_bytes())
                )
                direct_contract = parse_contract(base.model_dump_json())
                os.environ[key_env] = "sk-bench"
                direct, invoked = [], []
                for i in range(iterations + 5):
                    t0 = time.perf_counter()
                    await complete(direct_contract.model, [{"role": "user", "content": "say done"}], [])
                    direct_ms = (time.perf_counter() - t0) * 1000
                    contract = base.model_copy(
                        update={"run": base.run.model_copy(update={"attempt": i + 1, "fence": i + 1})}
                    )
                    inv = warrants.invocation(contract, f"http://127.0.0.1:{port}/")
                    t0 = time.perf_counter()
                    await ActivityEnvironment().run(acts.invoke_agent, inv)
                    invoked_ms = (time.perf_counter() - t0) * 1000
                    if i >= 5:  # the first few warm up connections and imports
                        direct.append(direct_ms)
                        invoked.append(invoked_ms)
                await store.close()
            finally:
                process.terminate()
                process.wait(10)
    d, a = percentiles(direct), percentiles(invoked)
    report(
        "agent_roundtrip",
        {
            "iterations": iterations,
            "model_direct": d,
            "invoke_agent": a,
            "overhead_p50_ms": round(a["p50_ms"] - d["p50_ms"], 3),
            "overhead_p99_ms": round(a["p99_ms"] - d["p99_ms"], 3),
            "ratio_p50": round(a["p50_ms"] / d["p50_ms"], 2),
        },
    )


async def wait_ready(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            try:
                if (await http.get(url, timeout=1)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=200)
    asyncio.run(main(parser.parse_args().iterations))
