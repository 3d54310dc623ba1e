"""Application services: the pico operations over ports."""
