"""Adapters: storage backends, the container, the CLI."""
