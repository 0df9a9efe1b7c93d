"""The database part of the test bed: a real PostgreSQL server and SQLite, each running a real query."""

import sqlalchemy as sa

from testbed.postgres import PostgresServer


def _roundtrip(url: str) -> tuple[list[tuple[int, str]], str]:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE probe (id INTEGER PRIMARY KEY, note TEXT NOT NULL)"))
            conn.execute(sa.text("INSERT INTO probe (id, note) VALUES (1, 'one'), (2, 'two')"))
        with engine.connect() as conn:
            rows = [(r.id, r.note) for r in conn.execute(sa.text("SELECT id, note FROM probe ORDER BY id"))]
            dialect = engine.dialect.name
        return rows, dialect
    finally:
        engine.dispose()


def test_postgres_runs_a_real_query(postgres: PostgresServer) -> None:
    rows, dialect = _roundtrip(postgres.dsn)
    assert dialect == "postgresql"
    assert rows == [(1, "one"), (2, "two")]
    engine = sa.create_engine(postgres.dsn)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    engine.dispose()
    assert int(version.split(".")[0]) >= 13


def test_sqlite_runs_a_real_query(sqlite_url: str) -> None:
    rows, dialect = _roundtrip(sqlite_url)
    assert dialect == "sqlite"
    assert rows == [(1, "one"), (2, "two")]
