"""Alembic's environment for the class store: always run from `serving.classroom.migrate`, which passes the
connection (no alembic.ini, no URL here)."""

from __future__ import annotations

from alembic import context

from serving.classroom import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
