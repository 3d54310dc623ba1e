"""Typed state addresses (§4.1, §9.2).

An address binds a namespace, an optional key, a scope and a rewind policy; its payload
type comes from the address and is validated (pydantic ``TypeAdapter``) at write time, in
strict mode so a write never coerces a value into a different type, and again at read time.
No global registration: create addresses where you need them; defaults belong at the read
site (``get_value(address, default=...)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from pico.domain.errors import (
    AddressPolicyError,
    CommandRejectedError,
    InvalidArgumentError,
    InvalidJsonError,
    StorageCorruptError,
    StoredTypeError,
)
from pico.domain.ids import check_id
from pico.domain.json import (
    JsonObject,
    JsonValue,
    check_json,
    check_name,
    dumps,
    is_strict_json,
    loads,
)
from pico.domain.state import (
    SESSION_SCOPE,
    check_namespace,
    conversation_scope,
    working_scope_id,
)

__all__ = [
    "Address",
    "ConversationList",
    "ConversationValue",
    "Initialization",
    "SessionList",
    "SessionValue",
    "WorkingList",
    "WorkingScope",
    "WorkingValue",
    "conversation_list",
    "conversation_value",
    "session_list",
    "session_value",
    "working_list",
    "working_scope",
    "working_value",
]

T = TypeVar("T")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter_for(type_: Any) -> TypeAdapter[Any]:
    """TypeAdapters are costly to build (~0.1 ms): share one per hashable type."""
    try:
        found = _ADAPTERS.get(type_)
    except TypeError:  # an unhashable type expression: build one each time
        return TypeAdapter(type_)
    if found is None:
        found = _ADAPTERS[type_] = TypeAdapter(type_)
    return found


#: Namespaces that passed an address's checks (flows build their few addresses on every
#: execution: the checks are the same each time). Bounded: past it, namespaces are checked
#: every time, as before.
_CHECKED_NAMESPACES: set[str] = set()
_CHECKED_LIMIT = 4096


def _is_untyped(type_: Any) -> bool:
    """Types whose stored form is the value itself: its strict-JSON check is the type check
    (pydantic cannot build an adapter for the recursive ``JsonValue`` alias)."""
    return type_ is Any or type_ is object or type_ in (JsonValue, JsonObject)


@dataclass(frozen=True, kw_only=True)
class Address(Generic[T]):
    namespace: str
    type_: Any = Any
    key: str | None = None
    _adapter: TypeAdapter[Any] = field(init=False, repr=False, compare=False)
    _untyped: bool = field(init=False, repr=False, compare=False)

    scope_kind = "session"
    kind = "value"

    def __post_init__(self) -> None:
        if self.key is not None and (not isinstance(self.key, str) or self.key == ""):
            raise CommandRejectedError("an address key must be a non-empty string or None")
        namespace = self.namespace
        if type(namespace) is not str or namespace not in _CHECKED_NAMESPACES:
            check_namespace(namespace, core=True)
            check_name(namespace, what="an address namespace")  # stored text
            if len(_CHECKED_NAMESPACES) < _CHECKED_LIMIT:
                _CHECKED_NAMESPACES.add(namespace)
        if self.key is not None:
            check_name(self.key, what="an address key")
        untyped = _is_untyped(self.type_)
        object.__setattr__(self, "_untyped", untyped)
        object.__setattr__(self, "_adapter", _adapter_for(Any if untyped else self.type_))

    @property
    def rewind(self) -> bool:
        return False

    @property
    def storage_key(self) -> str:
        return self.key or ""

    def encode(self, value: Any) -> str:
        """Validate ``value`` strictly against the address type; return its JSON text.

        An untyped address (``Any``/``object``) stores the value itself, so it must be
        strict JSON (the one gate, ``dumps``). A typed address stores its type's JSON form
        and accepts it only if that form reads back equal to what was written: a NaN float
        that would serialize as null, or any value the type cannot round-trip, is refused
        rather than silently changed."""
        what = f"value of {self.namespace!r}"
        if self._untyped:
            if self.type_ == JsonObject and not isinstance(value, dict):
                raise InvalidJsonError(
                    f"{what}: {type(value).__name__} is not a JSON object; the address type "
                    "is JsonObject (a dict with string keys)"
                )
            return dumps(value, what=what)
        try:
            valid = self._adapter.validate_python(value, strict=True)
            dumped = self._adapter.dump_python(valid, mode="json")
        except ValidationError as exc:
            raise InvalidJsonError(
                f"value for {self.namespace!r} does not match its address type "
                f"{self.type_!r}: {exc.errors()[0]['msg']}"
            ) from exc
        except (PydanticSerializationError, RecursionError, ValueError) as exc:
            check_json(value, what=what)  # a path-naming verdict when the value is plain data
            raise InvalidJsonError(
                f"{what} cannot be stored as JSON through its address type {self.type_!r}: "
                f"{str(exc)[:120]}"
            ) from exc
        text = dumps(dumped, what=what)
        if is_strict_json(value):
            return text  # plain JSON validated strictly against its type: stored as given
        try:
            same = self._adapter.validate_json(text) == valid
        except (ValidationError, RecursionError, ValueError):
            same = False
        if not same:
            if isinstance(value, (dict, list, tuple, set, frozenset, float, str, bytes)):
                check_json(value, what=what)  # name the offending path when there is one
            raise InvalidJsonError(
                f"{what} would be stored as {text[:80]} and read back as something else "
                f"through its address type {self.type_!r}; store a value whose JSON form "
                "reads back equal (e.g. a finite float, well-formed text)"
            )
        return text

    def decode(self, text: str) -> T:
        if self._untyped:
            try:
                plain: T = loads(text)  # type: ignore[assignment]
            except ValueError as exc:
                raise _undecodable(self.namespace, text) from exc
            if self.type_ != JsonObject or isinstance(plain, dict):
                return plain
        try:
            result: T = self._adapter.validate_json(text)
        except ValidationError as exc:
            if exc.errors()[0]["type"] == "json_invalid":
                raise _undecodable(self.namespace, text) from exc
            raise StoredTypeError(
                f"the stored value of {self.namespace!r} ({text[:80]}) does not match the "
                f"address type {self.type_!r}: {exc.errors()[0]['msg']}. Read it through an "
                "address of the type it was written with, or migrate it under a new namespace"
            ) from exc
        return result


def _undecodable(namespace: str, text: str) -> StorageCorruptError:
    return StorageCorruptError(
        f"the stored value of {namespace!r} ({text[:80]!r}) is not JSON: the database is "
        "damaged; nothing was changed. Restore it from a backup (pico check lists the damage)"
    )


@dataclass(frozen=True, kw_only=True)
class SessionValue(Address[T]):
    """Session-wide, sticky: one current value."""


@dataclass(frozen=True, kw_only=True)
class SessionList(Address[T]):
    kind = "list"


@dataclass(frozen=True, kw_only=True)
class ConversationValue(Address[T]):
    """Per conversation; ``rewind=True`` keeps history that forks inherit (§4.4)."""

    rewind_policy: bool = True
    scope_kind = "conversation"

    @property
    def rewind(self) -> bool:
        return self.rewind_policy


@dataclass(frozen=True, kw_only=True)
class ConversationList(ConversationValue[T]):
    kind = "list"


@dataclass(frozen=True)
class WorkingScope:
    """A named working lifetime (§4.6), e.g. one per task attempt."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise CommandRejectedError("a working scope needs a non-empty name")
        check_name(self.name, what="a working scope name")

    @property
    def scope_id(self) -> str:
        return working_scope_id(self.name)


@dataclass(frozen=True, kw_only=True)
class WorkingValue(Address[T]):
    scope: WorkingScope
    scope_kind = "working"


@dataclass(frozen=True, kw_only=True)
class WorkingList(WorkingValue[T]):
    kind = "list"


@overload
def session_value(namespace: str, type_: type[T], *, key: str | None = None) -> SessionValue[T]: ...
@overload
def session_value(
    namespace: str, type_: Any = ..., *, key: str | None = None
) -> SessionValue[Any]: ...
def session_value(namespace: str, type_: Any = Any, *, key: str | None = None) -> SessionValue[Any]:
    """A sticky session-wide value (§4.1)."""
    return SessionValue(namespace=namespace, type_=type_, key=key)


@overload
def session_list(namespace: str, type_: type[T], *, key: str | None = None) -> SessionList[T]: ...
@overload
def session_list(
    namespace: str, type_: Any = ..., *, key: str | None = None
) -> SessionList[Any]: ...
def session_list(namespace: str, type_: Any = Any, *, key: str | None = None) -> SessionList[Any]:
    """A sticky session-wide list."""
    return SessionList(namespace=namespace, type_=type_, key=key)


@overload
def conversation_value(
    namespace: str, type_: type[T], *, key: str | None = None, rewind: bool = True
) -> ConversationValue[T]: ...
@overload
def conversation_value(
    namespace: str, type_: Any = ..., *, key: str | None = None, rewind: bool = True
) -> ConversationValue[Any]: ...
def conversation_value(
    namespace: str, type_: Any = Any, *, key: str | None = None, rewind: bool = True
) -> ConversationValue[Any]:
    """A per-conversation value; rewindable ones keep history that forks inherit."""
    return ConversationValue(namespace=namespace, type_=type_, key=key, rewind_policy=rewind)


@overload
def conversation_list(
    namespace: str, type_: type[T], *, key: str | None = None, rewind: bool = True
) -> ConversationList[T]: ...
@overload
def conversation_list(
    namespace: str, type_: Any = ..., *, key: str | None = None, rewind: bool = True
) -> ConversationList[Any]: ...
def conversation_list(
    namespace: str, type_: Any = Any, *, key: str | None = None, rewind: bool = True
) -> ConversationList[Any]:
    """A per-conversation list; element ids are sequence numbers (the cursor)."""
    return ConversationList(namespace=namespace, type_=type_, key=key, rewind_policy=rewind)


def working_scope(name: str) -> WorkingScope:
    return WorkingScope(name)


@overload
def working_value(
    namespace: str, type_: type[T], *, scope: WorkingScope, key: str | None = None
) -> WorkingValue[T]: ...
@overload
def working_value(
    namespace: str, type_: Any = ..., *, scope: WorkingScope, key: str | None = None
) -> WorkingValue[Any]: ...
def working_value(
    namespace: str, type_: Any = Any, *, scope: WorkingScope, key: str | None = None
) -> WorkingValue[Any]:
    """A value in a working scope: survives restart until the scope is retired (§4.6)."""
    return WorkingValue(namespace=namespace, type_=type_, key=key, scope=scope)


@overload
def working_list(
    namespace: str, type_: type[T], *, scope: WorkingScope, key: str | None = None
) -> WorkingList[T]: ...
@overload
def working_list(
    namespace: str, type_: Any = ..., *, scope: WorkingScope, key: str | None = None
) -> WorkingList[Any]: ...
def working_list(
    namespace: str, type_: Any = Any, *, scope: WorkingScope, key: str | None = None
) -> WorkingList[Any]:
    return WorkingList(namespace=namespace, type_=type_, key=key, scope=scope)


def _scalar_conversation_address(address: object, what: str) -> ConversationValue[Any]:
    if not isinstance(address, Address):
        raise InvalidArgumentError(
            f"{what} must be a conversation value address (pico.conversation_value(...)), "
            f"got {type(address).__name__} {address!r:.80}"
        )
    if not isinstance(address, ConversationValue) or isinstance(address, WorkingValue):
        raise AddressPolicyError(
            f"{what}: {address.namespace!r} is a {address.scope_kind} address; only "
            "conversation values are initialized per conversation (session state is shared, "
            "working state is never inherited)"
        )
    if address.kind != "value":
        raise AddressPolicyError(
            f"{what}: {address.namespace!r} is a list; initialization selects scalar values "
            "only, so an unbounded log is never copied by accident (§4.3). Append the "
            "elements you want to the new conversation's list yourself"
        )
    return address


def _sequence(given: object, what: str, example: str) -> list[Any]:
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Iterable):
        raise InvalidArgumentError(
            f"Initialization({what}=...) takes a list of {example}, got "
            f"{type(given).__name__} {given!r:.80}"
        )
    return list(given)


@dataclass(frozen=True, init=False)
class Initialization:
    """Which conversation values a new conversation starts with (§4.3, §9.1).

    ``inherit`` selects values whose CURRENT source contents are copied (a selected value
    that is absent in the source stays absent); ``set`` overrides are applied after the
    copy, whether or not their address is selected. Anything else starts absent, with no
    fallback to the source. A copy, not a live link. Scalar values only: lists need a
    deliberate policy. Override values pass the same strict-JSON and type gate as
    ``set_value``, here at construction, and are kept as copies of what will be stored.

    Raises:
        InvalidArgumentError: ``inherit``/``set`` is not a list of addresses / of
            ``(address, value)`` pairs, or one address is overridden twice.
        AddressPolicyError: an address is a session, working or list address.
        InvalidJsonError: an override value is not strict JSON of its address type.
    """

    inherit: tuple[ConversationValue[Any], ...]
    set: tuple[tuple[ConversationValue[Any], Any], ...]
    _texts: tuple[str, ...] = field(repr=False, compare=False)

    def __init__(
        self,
        *,
        inherit: Iterable[ConversationValue[Any]] = (),
        set: Iterable[
            tuple[ConversationValue[Any], Any]
        ] = (),  # §4.3's word; shadows the builtin here only
    ) -> None:
        selected: dict[tuple[str, str], ConversationValue[Any]] = {}
        for address in _sequence(inherit, "inherit", "conversation value addresses"):
            checked = _scalar_conversation_address(address, "Initialization(inherit=...)")
            selected.setdefault((checked.namespace, checked.storage_key), checked)
        pairs: list[tuple[ConversationValue[Any], Any]] = []
        texts: list[str] = []
        overridden: dict[tuple[str, str], None] = {}  # (``set`` is the argument here)
        for pair in _sequence(set, "set", "(address, value) pairs"):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidArgumentError(
                    "each Initialization(set=...) item is an (address, value) pair, got "
                    f"{type(pair).__name__} {pair!r:.80}"
                )
            address = _scalar_conversation_address(pair[0], "Initialization(set=...)")
            ident = (address.namespace, address.storage_key)
            if ident in overridden:
                raise InvalidArgumentError(
                    f"Initialization(set=...) overrides {address.namespace!r}"
                    f"{'' if address.key is None else f' key {address.key!r}'} twice; "
                    "give each address one value"
                )
            overridden[ident] = None
            text = address.encode(pair[1])
            texts.append(text)
            pairs.append((address, address.decode(text)))  # a copy: later edits don't leak
        object.__setattr__(self, "inherit", tuple(selected.values()))
        object.__setattr__(self, "set", tuple(pairs))
        object.__setattr__(self, "_texts", tuple(texts))

    @classmethod
    def of(cls, selection: Initialization | Iterable[ConversationValue[Any]]) -> Initialization:
        """An ``Initialization`` as given, or one that inherits a plain list of addresses
        (the ``sticky=[address, ...]`` shorthand)."""
        if isinstance(selection, Initialization):
            return selection
        return cls(inherit=selection)

    @property
    def overrides(self) -> tuple[tuple[ConversationValue[Any], str], ...]:
        """The overrides with their validated stored JSON text, in the given order."""
        return tuple((a, t) for (a, _), t in zip(self.set, self._texts, strict=True))

    @property
    def addresses(self) -> tuple[ConversationValue[Any], ...]:
        """Every address this initialization touches, selected first."""
        return self.inherit + tuple(a for a, _ in self.set)


def scope_of(address: Address[Any], conversation_id: int | None) -> str:
    """The storage scope of an address, checking the scope fits the call."""
    if conversation_id is not None:
        check_id(conversation_id, "conversation_id")
    if isinstance(address, WorkingValue):
        if conversation_id is not None:
            raise AddressPolicyError("a working address is not bound to a conversation")
        return address.scope.scope_id
    if isinstance(address, ConversationValue):
        if conversation_id is None:
            raise AddressPolicyError(
                f"{address.namespace!r} is a conversation address; use it through a "
                "conversation (conversation.set_value / tx.set_value(..., conversation_id=))"
            )
        return conversation_scope(conversation_id)
    if conversation_id is not None:
        raise AddressPolicyError(
            f"{address.namespace!r} is a session address; it cannot be used as a "
            "conversation address"
        )
    return SESSION_SCOPE
