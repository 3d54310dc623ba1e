"""pico: a durable, event-sourced agent harness.

This package is the composition root: it re-exports the public API and registers the
storage adapters so ``await Harness.open("sqlite:///agent.db")`` works out of the box.
"""

from __future__ import annotations

from pico.application.command import Command, ConversationCommand, WorkingCommand
from pico.application.harness import ConversationHandle, Harness
from pico.application.ports import AuditRecord, Storage
from pico.application.registry import set_storage_opener
from pico.application.state import (
    ConversationList,
    ConversationValue,
    SessionList,
    SessionValue,
    WorkingList,
    WorkingScope,
    WorkingValue,
    conversation_list,
    conversation_value,
    session_list,
    session_value,
    working_list,
    working_scope,
    working_value,
)
from pico.domain.errors import (
    AddressPolicyError,
    ClosedError,
    CommandRejectedError,
    ContextEditError,
    ConversationDeletedError,
    ExchangeSplitError,
    HandleFaultedError,
    HistoricalReadError,
    InvalidJsonError,
    InvalidPositionError,
    PersistenceUncertainError,
    PicoError,
    ReadOnlyError,
    RequestKeyConflictError,
    ReservedNamespaceError,
    SequenceExhaustedError,
    StalePrefixError,
    StaleWriterError,
    StorageCorruptError,
    StoredTypeError,
    UnknownConversationError,
    UnknownEntryError,
    UnknownSessionError,
    WorkingScopeError,
)
from pico.domain.json import JsonObject, JsonValue
from pico.domain.values import (
    CommitBoundary,
    ConversationSnapshot,
    Entry,
    ListElement,
    Page,
    SessionMeta,
    Source,
    StoredValue,
    ValueItem,
    ValuePage,
)
from pico.infrastructure.container import open_storage
from pico.infrastructure.settings import PicoSettings

set_storage_opener(open_storage)

__all__ = [
    "AddressPolicyError",
    "AuditRecord",
    "ClosedError",
    "Command",
    "CommandRejectedError",
    "CommitBoundary",
    "ContextEditError",
    "ConversationCommand",
    "ConversationDeletedError",
    "ConversationHandle",
    "ConversationList",
    "ConversationSnapshot",
    "ConversationValue",
    "Entry",
    "ExchangeSplitError",
    "HandleFaultedError",
    "Harness",
    "HistoricalReadError",
    "InvalidJsonError",
    "InvalidPositionError",
    "JsonObject",
    "JsonValue",
    "ListElement",
    "Page",
    "PersistenceUncertainError",
    "PicoError",
    "PicoSettings",
    "ReadOnlyError",
    "RequestKeyConflictError",
    "ReservedNamespaceError",
    "SequenceExhaustedError",
    "SessionList",
    "SessionMeta",
    "SessionValue",
    "Source",
    "StalePrefixError",
    "StaleWriterError",
    "Storage",
    "StorageCorruptError",
    "StoredTypeError",
    "StoredValue",
    "UnknownConversationError",
    "UnknownEntryError",
    "UnknownSessionError",
    "ValueItem",
    "ValuePage",
    "WorkingCommand",
    "WorkingList",
    "WorkingScope",
    "WorkingScopeError",
    "WorkingValue",
    "conversation_list",
    "conversation_value",
    "session_list",
    "session_value",
    "working_list",
    "working_scope",
    "working_value",
]
