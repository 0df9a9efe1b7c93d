"""How the store reaches its database: URLs for the async drivers, UTC times, outages as StoreUnavailable."""

import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

from sqlalchemy import exc

from store.records import StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; everything stored is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def async_url(url: str) -> str:
    """Accept the plain forms operators write (postgresql://, sqlite:///) and pick the async drivers."""
    for prefix, driver in (
        ("postgresql://", "postgresql+psycopg://"),
        ("postgres://", "postgresql+psycopg://"),
        ("sqlite:///", "sqlite+aiosqlite:///"),
    ):
        if url.startswith(prefix):
            return driver + url[len(prefix) :]
    return url


def sync_url(url: str) -> str:
    url = async_url(url)
    return url.replace("sqlite+aiosqlite://", "sqlite://", 1)


def unavailable(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Database outages surface as StoreUnavailable (retryable), never as a silent success."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except (exc.OperationalError, exc.InterfaceError, OSError, ConnectionError) as err:
            raise StoreUnavailable(
                f"{func.__name__}: database unavailable: {err.__class__.__name__}: {err}"
            ) from err
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise StoreUnavailable(f"{func.__name__}: connection lost: {err}") from err
            raise

    return wrapper
