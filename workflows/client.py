"""How every ksquad process talks to Temporal: the pydantic data converter (the workflows' wire format),
credentials (TLS, API key), and ksquad's search attributes registered. Shared by the worker, the bridge and
the CLI, so it lives with the workflows it serves."""

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from workflows import search_attributes as sa


async def connect(target: str, namespace: str = "default", *, api_key: str | None = None, tls: bool = False,
                  server_root_ca: bytes | None = None) -> Client:  # fmt: skip
    """A client with ksquad's data converter; `api_key` (Temporal Cloud) implies TLS."""
    tls_config: TLSConfig | bool = tls or api_key is not None
    if server_root_ca is not None:
        tls_config = TLSConfig(server_root_ca_cert=server_root_ca)
    return await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter, api_key=api_key,
                                tls=tls_config)  # fmt: skip


def with_converter(client: Client) -> Client:
    """The same connection, with ksquad's data converter (for clients made by test environments)."""
    config = client.config()
    config["data_converter"] = pydantic_data_converter
    return Client(**config)


async def register_search_attributes(client: Client) -> list[str]:
    """Register ksquad's custom search attributes that the namespace lacks; return the ones added."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        known = set(existing.custom_attributes)
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server only adds
            raise
        known = set()
    missing = {
        k.name: IndexedValueType.ValueType(k.indexed_value_type) for k in sa.ALL if k.name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)
