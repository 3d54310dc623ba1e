"""SQLAlchemy Core backends (SQLite and PostgreSQL share one schema and one code path)."""
