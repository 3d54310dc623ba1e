"""What the built-in flows of seed §8 share: the services they run with, and small readers
of the JSON a task stores (never trusting its shape). Every flow module imports this one;
it imports no flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pico.application.clock import Clock, SystemClock
from pico.application.hooks import Hooks
from pico.application.model import ModelProvider
from pico.application.projection import Projection, ProjectionCache
from pico.application.telemetry import Telemetry
from pico.application.tools import ToolRegistry
from pico.domain.errors import InvalidJsonError
from pico.domain.json import JsonObject, JsonValue, strict_json
from pico.domain.values import Entry, TaskSnapshot

if TYPE_CHECKING:
    from pico.application.flows.job import JobServices

__all__ = [
    "TOOL_EXECUTION",
    "AgentServices",
    "append_frame",
    "closed_exchanges",
    "ints",
    "json_list",
    "names",
    "task_state",
]

#: How a generation's tool calls run (§5.4): all at once, or one after another in call order.
TOOL_EXECUTION = ("parallel", "sequential")


@dataclass
class AgentServices:
    """What every built-in flow runs with: the model provider, the tools, the hooks, the
    projection and the retry and context budgets a harness was opened with."""

    provider: ModelProvider
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    model: str = "default"
    system: str = ""
    max_attempts: int = 3
    retry_delay: float = 2.0
    clock: Clock = field(default_factory=SystemClock)
    projection: Projection = field(default_factory=Projection)
    projection_cache: ProjectionCache = field(default_factory=ProjectionCache)
    queue_selection: str = "all"  # or "one": the oldest queued input of each mode
    hooks: Hooks = field(default_factory=Hooks)
    active_tools: list[str] | None = None  # offered at first; None offers every tool
    context_budget: int | None = None  # estimated tokens; over it, collapse before a request
    tool_execution: str = "parallel"  # or "sequential": each call after the one before (§5.4)
    jobs: JobServices | None = None  # the process host and log directory (job delegations)
    telemetry: Telemetry = field(default_factory=Telemetry)  # provider and tool spans


def request_options(provider: ModelProvider) -> JsonObject:
    """The request options a provider sends (``provider.request_options()``: sampling
    settings such as ``{"temperature": 0.2, "max_tokens": 1024}``; ``{}`` without the
    method). A generation captures them when it is created, so a retry or a resumed
    generation sends what the first attempt sent (§8.3); never secrets."""
    method = getattr(provider, "request_options", None)
    options = strict_json(method() if callable(method) else {}, what="provider request_options()")
    if not isinstance(options, dict):
        raise InvalidJsonError(
            f"provider request_options() must return a JSON object, not "
            f"{type(options).__name__}; return e.g. {{'temperature': 0.2}}"
        )
    return options


def captured_options(state: Mapping[str, JsonValue]) -> JsonObject:
    """The request options a generation or collapse captured ({} before they existed)."""
    options = state.get("options")
    return dict(options) if isinstance(options, dict) else {}


def ints(value: JsonValue) -> list[int]:
    """The ints of a stored JSON list; anything else reads as none."""
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def task_state(task: TaskSnapshot) -> dict[str, JsonValue]:
    """A copy of a task's stored state object; anything else reads as empty."""
    return dict(task.state) if isinstance(task.state, dict) else {}


def json_list(values: Sequence[int] | Sequence[str]) -> list[JsonValue]:
    """Ids or names as a JSON list for a task's state."""
    return list(values)


def append_frame(frames: Any, text: str) -> Any:
    """A working command appending one streamed frame to a core-owned working list."""

    def build(wtx: Any) -> None:
        with wtx.tx.core():  # frames live in a core-owned working namespace
            wtx.append_list(frames, text)

    return build


def names(value: JsonValue) -> list[str]:
    """The strings (tool names) of a stored JSON list; anything else reads as none."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def closed_exchanges(headers: Mapping[int, Entry], ids: Sequence[int]) -> list[bool]:
    """For each id of a context, in order: is every tool call selected so far answered
    after it? A prefix ending where this is True never splits an exchange (§2.3)."""
    open_calls: set[str] = set()
    closed: list[bool] = []
    for entry_id in ids:
        entry = headers.get(entry_id)
        meta = (entry.metadata or {}) if entry is not None else {}
        answered = meta.get("tool_call_id")
        if isinstance(answered, str):
            open_calls.discard(answered)
        calls = meta.get("tool_calls")
        if isinstance(calls, list):
            open_calls.update(str(c) for c in calls)
        closed.append(not open_calls)
    return closed
