"""Scoped state (§4): scopes, working writes, and the reserved namespaces.

Addresses are typed in the application layer; storage only sees a scope string, a
namespace, a key ("" when absent), a kind (value | list), the rewind policy and JSON text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pico.domain.errors import ReservedNamespaceError

__all__ = [
    "REQUEST_INPUT_NAMESPACE",
    "SESSION_SCOPE",
    "StateWrite",
    "check_namespace",
    "conversation_scope",
    "working_scope_id",
]

SESSION_SCOPE = "session"
RESERVED_PREFIX = "pico."
#: §3.6: caller-provided request keys map to accepted inputs in this session namespace.
REQUEST_INPUT_NAMESPACE = "pico.request-input"

Kind = Literal["value", "list"]
Op = Literal["set", "delete", "append", "clear"]


def conversation_scope(conversation_id: int) -> str:
    return f"conversation/{conversation_id}"


def working_scope_id(name: str) -> str:
    return f"working/{name}"


def check_namespace(namespace: str, *, core: bool = False) -> None:
    if not isinstance(namespace, str) or not namespace:
        raise ReservedNamespaceError(str(namespace))
    if namespace.startswith(RESERVED_PREFIX) and not core:
        raise ReservedNamespaceError(namespace)


@dataclass(frozen=True)
class StateWrite:
    """One working-scope write. Working writes use the session's allocator but are not
    events: they live in prunable storage until the scope is retired (§4.6)."""

    scope: str
    op: Op
    seq: int
    namespace: str
    key: str
    value: str | None = None
