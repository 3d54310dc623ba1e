"""Pure projectors: events -> read-model row operations, and the in-memory read model."""
