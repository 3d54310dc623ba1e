"""Alembic environment for pico's SQL schema (``env.py``, ``versions/``).

Run through ``pico.infrastructure.sql.schema`` (on the caller's connection and
transaction) or ``pico db``; a developer adds a revision with
``alembic -c infrastructure/sql/migrations/alembic.ini revision -m "..."``.
"""
