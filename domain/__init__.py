"""The pico domain: aggregates, their events and invariants. No I/O happens here."""
