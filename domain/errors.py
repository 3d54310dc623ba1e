"""Errors raised by the domain and the command line.

Every error carries the ids involved and reads as a sentence a caller can act on.
A rejected command writes nothing and consumes no sequence number.
"""

from __future__ import annotations

__all__ = [
    "AddressPolicyError",
    "ClaimContendedError",
    "ClosedError",
    "CommandRejectedError",
    "ConfigurationError",
    "ConfigurationMismatchError",
    "ContextEditError",
    "ConversationDeletedError",
    "ExchangeSplitError",
    "HandleFaultedError",
    "HistoricalReadError",
    "InvalidArgumentError",
    "InvalidJsonError",
    "InvalidPositionError",
    "LiveWorkError",
    "NotInContextError",
    "PersistenceUncertainError",
    "PicoError",
    "ReadOnlyError",
    "ReplyTimeoutError",
    "RequestKeyConflictError",
    "ReservedNamespaceError",
    "SchemaOutdatedError",
    "SequenceExhaustedError",
    "SessionLeasedError",
    "SessionLockedError",
    "ShuttingDownError",
    "StalePrefixError",
    "StaleWriterError",
    "StorageCorruptError",
    "StorageUnavailableError",
    "StoredTypeError",
    "TaskDefinitionError",
    "TaskGraphError",
    "TerminalTaskError",
    "UnknownConversationError",
    "UnknownEntryError",
    "UnknownSessionError",
    "UnknownTaskError",
    "WorkingScopeError",
]


class PicoError(Exception):
    """Base class of every error pico raises on purpose."""


class CommandRejectedError(PicoError):
    """A command failed validation; nothing was written and no id was consumed."""


class InvalidJsonError(CommandRejectedError):
    """A payload is not strict JSON (NaN, non-string keys, tuples, objects...)."""


class InvalidArgumentError(CommandRejectedError):
    """An argument is malformed or out of its range: an id that is not a positive 64-bit
    integer (a bool, float or str is never taken as an id), a page limit outside its
    allowed range, an unknown mode. Nothing was read or written; the message names the
    argument, the allowed range and what was given."""


class ConfigurationError(PicoError):
    """How pico was asked to open storage is wrong: an unsupported or malformed storage URL,
    an empty or malformed session name, an unknown durability. Passwords are masked in the
    message."""


class StorageUnavailableError(PicoError):
    """The storage could not be reached or opened: a PostgreSQL server that does not
    answer or refuses the login, a SQLite path that is a directory or cannot be created or
    read. Nothing was changed; the message says what to check (passwords masked)."""


class ShuttingDownError(PicoError):
    """The harness is shutting down (``harness.shutdown()``) and admits no new public
    commands; its own cancellation commands still run."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} is shutting down and admits no new commands; open the "
            "session again after the shutdown completes"
        )


class UnknownConversationError(CommandRejectedError):
    def __init__(self, conversation_id: int, detail: str = "") -> None:
        self.conversation_id = conversation_id
        super().__init__(
            f"conversation {conversation_id} does not exist in this session{detail}; "
            "list conversations with harness.conversations() to find a valid id"
        )


class UnknownSessionError(PicoError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} does not exist in this storage; open it for writing once "
            "to create it, or check the session name"
        )


class UnknownEntryError(CommandRejectedError):
    def __init__(self, entry_id: int, detail: str = "") -> None:
        self.entry_id = entry_id
        super().__init__(f"entry {entry_id} does not exist{detail}")


class ConversationDeletedError(CommandRejectedError):
    def __init__(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        super().__init__(
            f"conversation {conversation_id} was deleted and accepts no new work; "
            "fork it at an earlier position to continue from its history"
        )


class ContextEditError(CommandRejectedError):
    """An illegal context edit (§2.3): wrong order, duplicate, foreign id, not a prefix."""

    def __init__(self, conversation_id: int, message: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"conversation {conversation_id}: {message}")


class ExchangeSplitError(ContextEditError):
    """The edit would split or strand an assistant's tool-call/result exchange."""


class StalePrefixError(ContextEditError):
    """A prepared prefix replacement lost a race with another replacement or reset."""


class NotInContextError(ContextEditError):
    """An entry id given as a context position (``through``, a prefix end) is not in the
    conversation's current context."""


class InvalidPositionError(CommandRejectedError):
    """A historical position is not a complete main commit boundary, or is unusable."""


class SequenceExhaustedError(CommandRejectedError):
    def __init__(self, head: int) -> None:
        self.head = head
        super().__init__(
            f"the session's sequence is exhausted at {head}: ids are positive safe integers "
            "(at most 2**53 - 1); start a new session"
        )


class AddressPolicyError(CommandRejectedError):
    """An address was used with a different rewind policy or scope than it was established
    with, or a conversation address where a session address belongs."""


class HistoricalReadError(CommandRejectedError):
    """Sticky, session and working state have no history: they cannot be read as of a
    position."""


class WorkingScopeError(CommandRejectedError):
    """A commit mixed main and working writes, or wrote to two working scopes."""


class ReservedNamespaceError(CommandRejectedError):
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        super().__init__(
            f"namespace {namespace!r} is reserved for pico's own state (names starting with "
            "'pico.'); choose another namespace"
        )


class RequestKeyConflictError(CommandRejectedError):
    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        super().__init__(
            f"request key {key!r} was already used {detail}; retry with the original request "
            "or use a new key"
        )


class UnknownTaskError(CommandRejectedError):
    def __init__(self, task_id: int, detail: str = "") -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id} does not exist in this session{detail}")


class TaskDefinitionError(CommandRejectedError):
    """A kind without a definition, a status the definition does not know, a transition it
    does not allow, or state it rejects."""


class TerminalTaskError(CommandRejectedError):
    def __init__(self, task_id: int, status: str) -> None:
        self.task_id = task_id
        super().__init__(
            f"task {task_id} is terminal ({status!r}); a terminal record accepts no further "
            "patch. Create a new task instead"
        )


class TaskGraphError(CommandRejectedError):
    """A dependency edit would create a cycle or cross execution-ownership trees."""


class LiveWorkError(CommandRejectedError):
    """The operation needs the conversation's ownership subtree to have no live work."""


class StoredTypeError(PicoError):
    """A stored value does not match the type of the address it is read through."""


class StaleWriterError(PicoError):
    """Another owner claimed this session; this handle's batch was not stored."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} was claimed by another owner since this handle opened it; "
            "nothing of this command was stored. Close this handle; only the newest owner may write"
        )


class PersistenceUncertainError(PicoError):
    """Storage failed while a batch was being persisted; its outcome is unknown."""

    def __init__(self, session_id: str, cause: BaseException) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r}: persisting a batch failed ({cause!r}); the batch may or "
            "may not be durable. This handle is now faulted: reopen the session to recover the "
            "last complete batch"
        )


class HandleFaultedError(PicoError):
    def __init__(self, session_id: str, reason: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"this handle on session {session_id!r} is faulted ({reason}) and refuses further "
            "use; reopen the session with Harness.open"
        )


class ClosedError(PicoError):
    def __init__(self, session_id: str, *, message: str | None = None) -> None:
        self.session_id = session_id
        super().__init__(
            message or f"the handle on session {session_id!r} is closed; open it again"
        )


class ReadOnlyError(PicoError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} was opened read-only (for audit); open it without "
            "read_only=True to write"
        )


class StorageCorruptError(PicoError):
    """Stored data could not be decoded or violates an invariant; nothing was changed."""


class ClaimContendedError(StaleWriterError):
    """Opening a session for writing lost its claim to concurrent commits on every
    attempt and gave up (only storage without a write lock can lose it); nothing was
    written and no handle was returned. Unlike its base class it fences nobody: the
    previous owner still holds the session."""

    def __init__(self, session_id: str, attempts: int) -> None:
        self.session_id = session_id
        self.attempts = attempts
        PicoError.__init__(
            self,
            f"opening session {session_id!r} for writing lost the claim to another writer's "
            f"commits {attempts} times in a row; nothing was written. Retry the open, or stop "
            "the other owner first",
        )


class SessionLockedError(StaleWriterError):
    """Another process holds the session's write lock (a JSONL store's ``flock``): opening
    it for writing is refused before anything is written. Unlike its base class it fences
    nobody: the other process stays the owner."""

    def __init__(self, session_id: str, lock: str) -> None:
        self.session_id = session_id
        self.lock = lock
        PicoError.__init__(
            self,
            f"session {session_id!r} is open for writing in another process (it holds the "
            f"lock on {lock}); nothing was written. Close that harness (the lock is released "
            "when its process exits, even by a crash), or open with read_only=True",
        )


class SchemaOutdatedError(ConfigurationError):
    """The database's pico schema is at an older revision than this code needs, and the
    open did not opt in to upgrading it (``PICO_UPGRADE_SCHEMA=1``); nothing was changed.
    The message names both revisions and the command that upgrades it."""

    def __init__(self, location: str, current: str, required: str, how: str) -> None:
        self.location = location
        self.current = current
        self.required = required
        super().__init__(
            f"the pico schema of {location} is at revision {current} but this pico needs "
            f"revision {required}; nothing was changed. {how}"
        )


class ConfigurationMismatchError(PicoError):
    """The configuration a session's agent work is written under (its fingerprint, seed
    000 "The resume gate") differs from the one it was opened with. ``changes`` lists each
    ``{field, class, before, after}`` (the system prompt as its sha256 hash, never
    verbatim). ``hard`` True: a hard field (the model) changed and the open
    was refused before its claim; nothing was written. ``hard`` False: a blocking field
    changed; the session opened but drives nothing until
    ``Harness.acknowledge_configuration()`` records the change."""

    def __init__(self, session_id: str, changes: list[dict[str, object]], *, hard: bool) -> None:
        self.session_id = session_id
        self.changes = changes
        self.hard = hard
        listed = "; ".join(
            f"{c['field']} ({c['class']}) recorded {c['before']!r}, now {c['after']!r}"
            for c in changes
        )
        if hard:
            what = (
                f"session {session_id!r} was written under another configuration and cannot "
                f"resume under this one: {listed}; nothing was written. Open it with the "
                "recorded configuration, or start (or fork into) a new session for the new one"
            )
        else:
            what = (
                f"session {session_id!r} was written under another configuration: {listed}; "
                "nothing was driven. Call `await harness.acknowledge_configuration()` to "
                "accept the change (it is recorded for auditors), or reopen with the "
                "recorded configuration"
            )
        super().__init__(what)


class SessionLeasedError(StaleWriterError):
    """Another worker holds the session's lease (``Harness.open(url, lease=...)`` on
    PostgreSQL) and it has not expired on the database's clock: the open is refused
    before its claim; nothing was written. Unlike its base class it fences nobody: the
    holder stays the owner. ``holder`` names it, ``expires_at`` is the expiry the
    database recorded at its last renewal, ``retry_after`` the seconds until then."""

    def __init__(
        self, session_id: str, holder: str, expires_at: object, retry_after: float
    ) -> None:
        self.session_id = session_id
        self.holder = holder
        self.expires_at = expires_at
        self.retry_after = retry_after
        PicoError.__init__(
            self,
            f"session {session_id!r} is leased by {holder} until {expires_at} (in "
            f"{retry_after:.1f}s, on the database's clock); nothing was written. Open it "
            "again after the lease expires (a holder that stops renewing loses it then), "
            "or open with read_only=True to read meanwhile",
        )


class ReplyTimeoutError(PicoError):
    """No owner replied to an inbox command in time (``Inbox.reply(..., timeout=)``). The
    command is stored and stays in the session's inbox: a worker executes it when it
    holds the session. Wait again with ``reply(submitted)``; submitting again with the
    same request key returns the same command, never a second one."""

    def __init__(self, session_id: str, command_id: int, timeout: float) -> None:
        self.session_id = session_id
        self.command_id = command_id
        self.timeout = timeout
        super().__init__(
            f"no worker replied to inbox command {command_id} of session {session_id!r} "
            f"within {timeout:g}s; it stays queued and runs when a worker takes the session "
            "(is one running? pico worker URL). Wait again with inbox.reply(submitted)"
        )
