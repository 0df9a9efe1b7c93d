import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from store import Store
from testbed.postgres import PostgresServer


class Clock:
    """A clock the test moves by hand (lease expiry without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a new PostgreSQL database on the session's server, or a SQLite file."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ksquad.db'}"
    postgres: PostgresServer = request.getfixturevalue("postgres")
    return postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def store(store_url: str, clock: Clock) -> AsyncIterator[Store]:
    store = await Store.open(store_url, clock=clock, pool_size=30)
    try:
        yield store
    finally:
        await store.close()


StoreFactory = Callable[[], Store]
