"""Connecting to Temporal the way every ksquad process must: the pydantic data converter, the search
attributes registered."""

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes as sa


async def connect(target: str, namespace: str = "default") -> Client:
    return await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter)


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
