"""The store's tests run against SQLite and against a real PostgreSQL server.

PostgreSQL: ``QOSFLOW_TEST_POSTGRES_URL`` (default: the server these machines run at
127.0.0.1:5432, trust auth, database ``test``). Each test gets a database of its own, dropped
afterwards. Without a server the PostgreSQL cases skip, except when ``CI`` is set: then they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

DEFAULT_POSTGRES = "postgresql+psycopg://root@127.0.0.1:5432/test"


def _admin_url() -> str:
    return os.environ.get("QOSFLOW_TEST_POSTGRES_URL", DEFAULT_POSTGRES)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (its SQLAlchemy URL)."""
    import psycopg

    admin = make_url(_admin_url())
    plain = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        conn = psycopg.connect(plain, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the PostgreSQL server at {admin.render_as_string()}: {exc}")
        pytest.skip(f"no PostgreSQL server at {admin.render_as_string()}: {exc}")
    name = f"qosflow_t_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty store: a SQLite file, or a PostgreSQL database of its own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return str(request.getfixturevalue("postgres_url"))
