"""`make testbins` builds every Python environment the tests use (testbed.pyenvs.FIELD_ENVS): the tests run in a
network namespace of their own (testbed.isolate), where pip reaches no index, so an environment left out is
built there and fails ("from versions: none"), as the LangGraph agent's did on a fresh machine."""

from testbed import framework_agents
from testbed.pyenvs import FIELD_ENVS, MCP_PROXY, MCP_SERVERS


def test_every_environment_a_test_uses_is_built_by_make_testbins() -> None:
    used = {name: pins for name, pins, _script in framework_agents.FRAMEWORKS.values()}
    used |= {"mcp-servers": MCP_SERVERS, "mcp-proxy": MCP_PROXY}
    missing = {name: pins for name, pins in used.items() if FIELD_ENVS.get(name) != pins}
    assert not missing, f"used by the tests but not built by `make testbins`: {missing}"
