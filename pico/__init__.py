"""pico: a durable, event-sourced agent harness.

This package is the composition root: it re-exports the public API and registers the
storage adapters so ``await Harness.open("sqlite:///agent.db")`` works out of the box.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pico._version import package_version
from pico.application.audit import AuditEntry, audit_records
from pico.application.chain import ChainBreak, ChainReport
from pico.application.clock import Clock, FakeClock, SystemClock
from pico.application.command import Command, ConversationCommand, WorkingCommand
from pico.application.conversation import ConversationHandle
from pico.application.faux import FauxDeferred, FauxFailure, FauxProvider, FauxResponse
from pico.application.flows import AgentServices, InputResult, ToolCallAnsweredError
from pico.application.flows.subagent import subagent_tool
from pico.application.harness import Harness
from pico.application.hooks import (
    CollapseDecision,
    Hooks,
    ToolCall,
    ToolDecision,
    YieldDecision,
)
from pico.application.host import ExitResult, LaunchSpec, ProcessHost
from pico.application.lease import Lease
from pico.application.model import (
    Deferred,
    Done,
    ImagePart,
    Message,
    Messages,
    ModelProvider,
    Part,
    ProviderError,
    Request,
    Response,
    StopReason,
    StreamEvent,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
    Usage,
    estimate_tokens,
)
from pico.application.ports import AuditRecord, Storage
from pico.application.projection import Projection, project_context
from pico.application.recurrence import Recurrence
from pico.application.registry import set_host_factory, set_storage_opener
from pico.application.scheduler import DriveOutcome, Execution, StaleExecutionError
from pico.application.state import (
    ConversationList,
    ConversationValue,
    Initialization,
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
from pico.application.tasks import TaskDefinition, TaskExecution, TaskRegistry
from pico.application.telemetry import Telemetry
from pico.application.tools import (
    JobDelegation,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolDelegation,
    ToolOutcome,
    ToolRegistry,
)
from pico.application.watch import (
    WatchBase,
    WatchChange,
    WatchCommit,
    WatchEvent,
    WatchPreview,
    WatchSignal,
    WatchStream,
)
from pico.application.worker import Worker
from pico.domain.errors import (
    AddressPolicyError,
    ClaimContendedError,
    ClosedError,
    CommandRejectedError,
    ConfigurationError,
    ConfigurationMismatchError,
    ContextEditError,
    ConversationDeletedError,
    ExchangeSplitError,
    HandleFaultedError,
    HistoricalReadError,
    InvalidArgumentError,
    InvalidJsonError,
    InvalidPositionError,
    LiveWorkError,
    NotInContextError,
    PersistenceUncertainError,
    PicoError,
    ReadOnlyError,
    ReplyTimeoutError,
    RequestKeyConflictError,
    ReservedNamespaceError,
    SchemaOutdatedError,
    SequenceExhaustedError,
    SessionLeasedError,
    SessionLockedError,
    ShuttingDownError,
    StalePrefixError,
    StaleWriterError,
    StorageCorruptError,
    StorageUnavailableError,
    StoredTypeError,
    TaskDefinitionError,
    TaskGraphError,
    TerminalTaskError,
    UnknownConversationError,
    UnknownEntryError,
    UnknownSessionError,
    UnknownTaskError,
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
    TaskSnapshot,
    ValueItem,
    ValuePage,
)
from pico.infrastructure.host import PosixProcessHost
from pico.infrastructure.settings import PicoSettings

if TYPE_CHECKING:
    from pico.infrastructure.container import Container
    from pico.infrastructure.migrate import MigrationReport, migrate
    from pico.infrastructure.replay import (
        RebuildReport,
        ReplayReport,
        TableDiff,
        rebuild,
        replay,
    )
    from pico.infrastructure.sql.work import Inbox, Submitted, open_worker
    from pico.infrastructure.tamper import verify
    from pico.infrastructure.verify import CheckReport, Finding, RowDiff, check

#: Names imported when first used (PEP 562), each from its module: the container and the
#: auditors', migrators' and workers' tools, which import SQLAlchemy. A service on memory
#: or JSONL storage does not load SQLAlchemy, and `import pico` takes half the time
#: (docs/benchmarks.md, thirteenth pass).
_LAZY = {
    "Container": "pico.infrastructure.container",
    "MigrationReport": "pico.infrastructure.migrate",
    "migrate": "pico.infrastructure.migrate",
    "RebuildReport": "pico.infrastructure.replay",
    "ReplayReport": "pico.infrastructure.replay",
    "TableDiff": "pico.infrastructure.replay",
    "rebuild": "pico.infrastructure.replay",
    "replay": "pico.infrastructure.replay",
    "Inbox": "pico.infrastructure.sql.work",
    "Submitted": "pico.infrastructure.sql.work",
    "open_worker": "pico.infrastructure.sql.work",
    "verify": "pico.infrastructure.tamper",
    "CheckReport": "pico.infrastructure.verify",
    "Finding": "pico.infrastructure.verify",
    "RowDiff": "pico.infrastructure.verify",
    "check": "pico.infrastructure.verify",
}


# Hidden from type checkers: a module ``__getattr__`` would type every misspelled
# ``pico.X`` as Any; they see the TYPE_CHECKING imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'pico' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: later reads find it as a plain global
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


def _open_storage(url: str, *, session: str, durability: str | None, read_only: bool) -> Storage:
    """``Harness.open(url)``'s opener: the container's, imported with the first open."""
    from pico.infrastructure.container import open_storage as opener

    return opener(url, session=session, durability=durability, read_only=read_only)


set_storage_opener(_open_storage)
set_host_factory(PosixProcessHost)

#: The installed version (pyproject.toml's ``version``, read from the package metadata).
__version__ = package_version()

__all__ = [
    "AddressPolicyError",
    "AgentServices",
    "AuditEntry",
    "AuditRecord",
    "ChainBreak",
    "ChainReport",
    "CheckReport",
    "ClaimContendedError",
    "Clock",
    "ClosedError",
    "CollapseDecision",
    "Command",
    "CommandRejectedError",
    "CommitBoundary",
    "ConfigurationError",
    "ConfigurationMismatchError",
    "Container",
    "ContextEditError",
    "ConversationCommand",
    "ConversationDeletedError",
    "ConversationHandle",
    "ConversationList",
    "ConversationSnapshot",
    "ConversationValue",
    "Deferred",
    "Done",
    "DriveOutcome",
    "Entry",
    "ExchangeSplitError",
    "Execution",
    "ExitResult",
    "FakeClock",
    "FauxDeferred",
    "FauxFailure",
    "FauxProvider",
    "FauxResponse",
    "Finding",
    "HandleFaultedError",
    "Harness",
    "HistoricalReadError",
    "Hooks",
    "ImagePart",
    "Inbox",
    "Initialization",
    "InputResult",
    "InvalidArgumentError",
    "InvalidJsonError",
    "InvalidPositionError",
    "JobDelegation",
    "JsonObject",
    "JsonValue",
    "LaunchSpec",
    "Lease",
    "ListElement",
    "LiveWorkError",
    "Message",
    "Messages",
    "MigrationReport",
    "ModelProvider",
    "NotInContextError",
    "Page",
    "Part",
    "PersistenceUncertainError",
    "PicoError",
    "PicoSettings",
    "PosixProcessHost",
    "ProcessHost",
    "Projection",
    "ProviderError",
    "ReadOnlyError",
    "RebuildReport",
    "Recurrence",
    "ReplayReport",
    "ReplyTimeoutError",
    "Request",
    "RequestKeyConflictError",
    "ReservedNamespaceError",
    "Response",
    "RowDiff",
    "SchemaOutdatedError",
    "SequenceExhaustedError",
    "SessionLeasedError",
    "SessionList",
    "SessionLockedError",
    "SessionMeta",
    "SessionValue",
    "ShuttingDownError",
    "Source",
    "StaleExecutionError",
    "StalePrefixError",
    "StaleWriterError",
    "StopReason",
    "Storage",
    "StorageCorruptError",
    "StorageUnavailableError",
    "StoredTypeError",
    "StoredValue",
    "StreamEvent",
    "Submitted",
    "SystemClock",
    "TableDiff",
    "TaskDefinition",
    "TaskDefinitionError",
    "TaskExecution",
    "TaskGraphError",
    "TaskRegistry",
    "TaskSnapshot",
    "Telemetry",
    "TerminalTaskError",
    "TextDelta",
    "TextPart",
    "ThinkingDelta",
    "ThinkingPart",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallAnsweredError",
    "ToolCallPart",
    "ToolContext",
    "ToolDecision",
    "ToolDelegation",
    "ToolOutcome",
    "ToolRegistry",
    "ToolResultPart",
    "ToolSpec",
    "UnknownConversationError",
    "UnknownEntryError",
    "UnknownSessionError",
    "UnknownTaskError",
    "Usage",
    "ValueItem",
    "ValuePage",
    "WatchBase",
    "WatchChange",
    "WatchCommit",
    "WatchEvent",
    "WatchPreview",
    "WatchSignal",
    "WatchStream",
    "Worker",
    "WorkingCommand",
    "WorkingList",
    "WorkingScope",
    "WorkingScopeError",
    "WorkingValue",
    "YieldDecision",
    "__version__",
    "audit_records",
    "check",
    "conversation_list",
    "conversation_value",
    "estimate_tokens",
    "migrate",
    "open_worker",
    "project_context",
    "rebuild",
    "replay",
    "session_list",
    "session_value",
    "subagent_tool",
    "verify",
    "working_list",
    "working_scope",
    "working_value",
]
