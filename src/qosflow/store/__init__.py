"""The shared store: the history of every job key and the promise ledger (SQLAlchemy).

SQLite (WAL) on one host, PostgreSQL across hosts. :class:`~qosflow.store.history.HistoryStore`
is the entry point.
"""
