"""Alembic migrations of the coordination store (`versions/`); `Store.migrate` and `upgrade_sync` run them."""

from pathlib import Path

import sqlalchemy as sa

LOCATION = Path(__file__).parent


def upgrade(connection: sa.Connection, revision: str = "head") -> None:
    """Bring the schema to `revision`, the newest by default, over `connection` (a no-op when it is there)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(LOCATION))
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def upgrade_sync(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        upgrade(connection)
