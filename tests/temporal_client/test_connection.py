"""How every ksquad process connects to Temporal from its environment (the chart's `temporal.*` values become these
variables): an API key (Temporal Cloud's, the chart's `temporal.apiKeySecret`) implies TLS, so a key is never sent
in clear. Against the dev server, which speaks no TLS: without a key the process connects, with one it does not.
With a key and a server that does speak TLS: tests/worker/test_temporal_mtls.py."""

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from dev.devserver import DevServer
from temporal_client.connection import TemporalSettings


async def test_an_api_key_from_the_environment_is_only_ever_sent_over_tls(dev_server: DevServer) -> None:
    plain = await TemporalSettings.from_env({"KSQUAD_TEMPORAL_ADDRESS": dev_server.target}).connect()
    assert plain.api_key is None
    assert (await plain.workflow_service.get_system_info(GetSystemInfoRequest())).server_version

    keyed = TemporalSettings.from_env(
        {"KSQUAD_TEMPORAL_ADDRESS": dev_server.target, "KSQUAD_TEMPORAL_API_KEY": "cloud-key"}
    )
    assert (keyed.api_key, keyed.tls) == ("cloud-key", False), "no TLS asked for: the key implies it"
    with pytest.raises(RuntimeError, match=r"(?i)tls|ssl|handshake|transport|connect"):
        await keyed.connect()  # a TLS handshake with a server that speaks none: nothing sent in clear
