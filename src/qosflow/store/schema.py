"""The one SQLAlchemy ``MetaData`` every table of the store is declared on."""

from __future__ import annotations

from sqlalchemy import MetaData

METADATA = MetaData()
"""Tables of the history store, the promise ledger and the job board."""
