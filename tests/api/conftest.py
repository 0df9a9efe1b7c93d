"""The store fixtures of tests/activities (a fresh PostgreSQL database or SQLite file per test), for the API's
tests of what it reads from the store."""

from tests.activities.conftest import clock, store, store_url  # noqa: F401 (fixtures)
