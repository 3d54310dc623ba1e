"""pico: a durable, event-sourced agent harness.

This package is the composition root: it re-exports the public API and registers the
storage adapters so ``await Harness.open("sqlite:///agent.db")`` works out of the box.
"""

from __future__ import annotations

from pico.application.command import Command, ConversationCommand
from pico.application.harness import ConversationHandle, Harness
from pico.application.ports import AuditRecord, Storage
from pico.application.registry import set_storage_opener
from pico.domain.errors import (
    ClosedError,
    CommandRejectedError,
    ContextEditError,
    ConversationDeletedError,
    ExchangeSplitError,
    HandleFaultedError,
    InvalidJsonError,
    InvalidPositionError,
    PersistenceUncertainError,
    PicoError,
    ReadOnlyError,
    SequenceExhaustedError,
    StalePrefixError,
    StaleWriterError,
    StorageCorruptError,
    UnknownConversationError,
    UnknownEntryError,
    UnknownSessionError,
)
from pico.domain.json import JsonObject, JsonValue
from pico.domain.values import (
    CommitBoundary,
    ConversationSnapshot,
    Entry,
    Page,
    SessionMeta,
    Source,
)
from pico.infrastructure.container import open_storage
from pico.infrastructure.settings import PicoSettings

set_storage_opener(open_storage)

__all__ = [
    "AuditRecord",
    "ClosedError",
    "Command",
    "CommandRejectedError",
    "CommitBoundary",
    "ContextEditError",
    "ConversationCommand",
    "ConversationDeletedError",
    "ConversationHandle",
    "ConversationSnapshot",
    "Entry",
    "ExchangeSplitError",
    "HandleFaultedError",
    "Harness",
    "InvalidJsonError",
    "InvalidPositionError",
    "JsonObject",
    "JsonValue",
    "Page",
    "PersistenceUncertainError",
    "PicoError",
    "PicoSettings",
    "ReadOnlyError",
    "SequenceExhaustedError",
    "SessionMeta",
    "Source",
    "StalePrefixError",
    "StaleWriterError",
    "Storage",
    "StorageCorruptError",
    "UnknownConversationError",
    "UnknownEntryError",
    "UnknownSessionError",
]
