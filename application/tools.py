"""Tools (§8.4, §9.3): JSON-Schema-checked capabilities a generation may offer.

A tool's parameters are validated before invocation; a replay policy says whether recovery
may run it again after an interrupted attempt. While it runs, a tool writes through a
``ToolContext``: bounded progress text, details, usage, and control intents (add tools,
terminate, hand off) that the join interprets after the exchange — a tool never edits
context or inspects its siblings.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from pico.application.host import DEFAULT_GRACE, DEFAULT_LOG_CAP, LaunchSpec, check_grace
from pico.application.model import ToolSpec, Usage
from pico.application.state import Initialization
from pico.domain.errors import (
    CommandRejectedError,
    InvalidArgumentError,
    InvalidJsonError,
    PicoError,
)
from pico.domain.ids import check_choice
from pico.domain.json import JsonObject, JsonValue, check_json, strict_json

__all__ = [
    "JobDelegation",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolDelegation",
    "ToolOutcome",
    "ToolRegistry",
]

#: Default cap on a tool's accumulated output text (characters).
OUTPUT_CAP = 64_000
#: Image caps per result: count and size of each (bytes before encoding).
MAX_IMAGES = 8
IMAGE_CAP_BYTES = 5 * 2**20
TRUNCATED = "\n[output truncated]"


def _check_text(text: object, what: str) -> None:
    if not isinstance(text, str):
        raise InvalidJsonError(f"{what} must be text (a str), not {type(text).__name__}")
    check_json(text, what=what)


class ToolArgumentsError(PicoError):
    """The arguments a model produced do not satisfy the tool's JSON Schema."""


@dataclass(frozen=True)
class ToolDelegation:
    """What a tool returns to hand its call to durable work instead of finishing it
    itself (§5.5, §5.6, §9.3): a subagent launch. No in-process promise: the launch is
    committed with the tool's own next status, and recovery needs nothing but the store.

    ``background=False`` (foreground): ONE command creates the subagent owner S and moves
    the call to ``finishing`` after S; the exchange cannot finish until S settles, then the
    call reads S's result (the child's answer text, or its failure), runs ``after_tool``
    and writes its own result. ``background=True``: ONE command creates S, writes the
    call's result naming S (``details["subagent"]``) and settles the call; the exchange
    goes on while S runs. ``context``, ``values`` and ``tools`` are ``spawn``'s: the
    child's starting context (fresh | inherit: the parent's last complete exchange, never
    this call), its initial values and its offered tools (default: the tools a new input
    is offered, without the delegating tool itself, so a child does not recurse unless
    you list it)."""

    prompt: JsonValue
    background: bool = False
    context: str = "fresh"
    values: Initialization | None = None  # or a list of addresses to inherit
    tools: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_json(self.prompt, what="delegated prompt")
        if type(self.background) is not bool:
            raise InvalidArgumentError(
                f"ToolDelegation.background must be True or False, got {self.background!r}"
            )
        check_choice(self.context, "ToolDelegation.context", CHILD_CONTEXTS)
        if self.values is not None:
            object.__setattr__(self, "values", Initialization.of(self.values))
        if self.tools is not None:
            object.__setattr__(self, "tools", tool_names(self.tools, "ToolDelegation.tools"))


@dataclass(frozen=True)
class JobDelegation:
    """What a tool returns to hand its call to a job (§8.7, §9.3): an OS process run by
    the harness's process host, committed with the tool's own next status.

    ``background=False`` (foreground): ONE command creates the job J (foreground work of
    this exchange) and moves the call to ``finishing`` after J; the conversation's drive
    waits for the process to exit, then the call's result is how it ended and the tails of
    its output (an error result unless it exited 0). ``background=True``: ONE command
    creates J, writes the call's result naming J (``details["job"]``) and settles the call;
    the exchange goes on while J runs (``harness.task(J)``, ``harness.wait_for(J)``).
    The fields are ``conversation.start_job``'s, checked when this is built."""

    argv: tuple[str, ...]
    cwd: str | None = None
    env: dict[str, str] | None = field(default=None, hash=False)
    log_cap: int = DEFAULT_LOG_CAP
    grace: float = DEFAULT_GRACE
    background: bool = False

    def __post_init__(self) -> None:
        spec = LaunchSpec(self.argv, self.cwd, self.env, self.log_cap)
        object.__setattr__(self, "argv", spec.argv)
        object.__setattr__(self, "env", spec.env)
        object.__setattr__(self, "grace", check_grace(self.grace))
        if type(self.background) is not bool:
            raise InvalidArgumentError(
                f"JobDelegation.background must be True or False, got {self.background!r}"
            )


#: How a child conversation's context starts: only its prompt, or the parent's context so
#: far (its last complete exchange) and then the prompt.
CHILD_CONTEXTS = ("fresh", "inherit")


def tool_names(given: object, what: str) -> tuple[str, ...]:
    """A list of tool names as a tuple, or ``InvalidArgumentError`` (a bare string is not
    a list of names)."""
    problem = InvalidArgumentError(f"{what} must be a list of tool names, got {given!r:.80}")
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise problem
    items = list(given)
    if not all(isinstance(t, str) for t in items):
        raise problem
    return tuple(items)


@dataclass
class ToolOutcome:
    """What a tool run produced, assembled from its context; the join reads this."""

    text: str = ""
    is_error: bool = False
    details: JsonValue = None
    usage: Usage | None = None
    add_tools: tuple[str, ...] = ()
    terminate: bool = False
    handoff: JsonValue = None
    deferred: bool = False
    images: tuple[JsonObject, ...] = ()  # {"mime": ..., "data": base64}
    delegation: ToolDelegation | JobDelegation | None = None  # continues as a subagent/job


class ToolContext:
    """The execution context of one tool call: its identity, the stop signal and a bounded
    output sink. ``sink`` (set by the tool task) receives admitted progress, awaited, so
    backpressure is explicit; output beyond the cap is dropped with a marker."""

    def __init__(
        self,
        *,
        call_id: str,
        tool_name: str,
        signal: asyncio.Event | None = None,
        sink: Callable[[str], Awaitable[None]] | None = None,
        cap: int = OUTPUT_CAP,
    ) -> None:
        self.call_id = call_id
        self.tool_name = tool_name
        self.signal = signal or asyncio.Event()
        self._sink = sink
        self._cap = cap
        self._text: list[str] = []
        self._size = 0
        self._truncated = False
        self._outcome = ToolOutcome()

    @property
    def cancelled(self) -> bool:
        return self.signal.is_set()

    async def write(self, text: str) -> None:
        """Append progress text (bounded); awaits the sink so progress is admitted in order.
        Text that is not well-formed (not a ``str``, or with a lone surrogate) raises
        ``InvalidJsonError`` here, in the tool, before anything is kept."""
        _check_text(text, f"progress text of tool {self.tool_name!r}")
        admitted = self._keep(text)
        if admitted and self._sink is not None:
            await self._sink(admitted)

    def _keep(self, text: str) -> str:
        """Bound and keep ``text`` for the result; returns what was kept."""
        if self._truncated or not text:
            return ""
        room = self._cap - self._size
        if len(text) > room:
            text, self._truncated = text[:room] + TRUNCATED, True
        self._text.append(text)
        self._size += len(text)
        return text

    async def add_image(self, data: bytes, mime: str = "image/png") -> None:
        """Attach an image to the result (bounded: at most ``MAX_IMAGES`` of at most
        ``IMAGE_CAP_BYTES`` each; beyond the caps it is dropped with a note in the text)."""
        if len(self._outcome.images) >= MAX_IMAGES or len(data) > IMAGE_CAP_BYTES:
            await self.write(
                f"\n[image dropped: over the cap of {MAX_IMAGES} images of {IMAGE_CAP_BYTES} bytes]"
            )
            return
        encoded = base64.b64encode(data).decode("ascii")
        self._outcome.images = (*self._outcome.images, {"mime": mime, "data": encoded})

    def set_details(self, details: JsonValue) -> None:
        self._outcome.details = strict_json(details, what="tool details")

    def report_usage(self, usage: Usage) -> None:
        self._outcome.usage = usage if self._outcome.usage is None else self._outcome.usage + usage

    def add_tools(self, *names: str) -> None:
        self._outcome.add_tools = tuple(dict.fromkeys((*self._outcome.add_tools, *names)))

    def terminate(self) -> None:
        """Ask the join to stop after this exchange (no next generation)."""
        self._outcome.terminate = True

    def defer(self) -> None:
        """The result will be supplied from outside (``Harness.answer_tool_call``): the
        call is parked durably instead of settled; text written so far is kept."""
        self._outcome.deferred = True

    def handoff(self, content: JsonValue) -> None:
        """Ask the join to append a handoff entry and reset context after the exchange."""
        self._outcome.handoff = strict_json(content, what="handoff")

    def outcome(self, *, is_error: bool = False, text: str | None = None) -> ToolOutcome:
        out = self._outcome
        out.text = "".join(self._text) if text is None else text
        out.is_error = is_error
        return out


Execute = Callable[
    [JsonObject, ToolContext], Awaitable[str | ToolDelegation | JobDelegation | None]
]


@dataclass(frozen=True)
class Tool:
    """A capability offered to the model. ``execute(args, ctx)`` may return final text (or
    write it through ``ctx.write``), or a ``ToolDelegation`` (``JobDelegation``) to continue
    the call as a subagent (a job); ordinary exceptions become error results.

    ``sequential=True`` makes each call of this tool a barrier within its response (§5.4):
    it starts only after every earlier call of the same response has settled, and every
    later call starts only after it has settled. Other calls keep running in parallel."""

    name: str
    description: str
    parameters: JsonObject
    execute: Execute
    replay: Literal["safe", "never"] = "never"
    sequential: bool = False
    _validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise CommandRejectedError("a tool needs a name")
        if type(self.sequential) is not bool:
            raise InvalidArgumentError(
                f"tool {self.name!r}: sequential must be True or False, got "
                f"{self.sequential!r} ({type(self.sequential).__name__})"
            )
        schema = strict_json(self.parameters, what=f"tool {self.name!r} parameters")
        try:
            Draft202012Validator.check_schema(schema)  # type: ignore[arg-type]
        except SchemaError as exc:
            raise CommandRejectedError(
                f"tool {self.name!r}: parameters are not a valid JSON Schema: {exc.message}"
            ) from exc
        object.__setattr__(self, "_validator", Draft202012Validator(schema))  # type: ignore[arg-type]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: JsonValue) -> JsonObject:
        """The arguments as validated JSON (a copy), or ``ToolArgumentsError``."""
        args = strict_json(arguments, what=f"arguments of {self.name!r}")
        if not isinstance(args, dict):
            raise ToolArgumentsError(f"tool {self.name!r} takes a JSON object of arguments")
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            first: ValidationError = errors[0]
            where = "/".join(str(p) for p in first.path) or "(root)"
            raise ToolArgumentsError(
                f"arguments of tool {self.name!r} are invalid at {where}: {first.message}"
            )
        return args

    async def run(self, arguments: JsonValue, ctx: ToolContext) -> ToolOutcome:
        """Validate, then invoke. Invalid arguments and ordinary exceptions become error
        results without (or after) invocation; cancellation propagates."""
        try:
            args = self.validate(arguments)
        except ToolArgumentsError as exc:
            return ctx.outcome(is_error=True, text=str(exc))
        return await self.invoke(args, ctx)

    async def invoke(self, args: JsonObject, ctx: ToolContext) -> ToolOutcome:
        """``run`` for arguments this tool's ``validate`` returned (the tool flow validates
        a call's arguments before it persists them, and invokes what it persisted)."""
        try:
            final = await self.execute(args, ctx)
        except Exception as exc:
            return ctx.outcome(is_error=True, text=f"{type(exc).__name__}: {exc}")
        if isinstance(final, (ToolDelegation, JobDelegation)):
            outcome = ctx.outcome()
            outcome.delegation = final
            return outcome
        if final is not None:
            try:
                _check_text(final, f"the result of tool {self.name!r}")
            except InvalidJsonError as exc:
                return ctx.outcome(is_error=True, text=f"InvalidJsonError: {exc}")
            # The returned text is the result, published by the settlement that follows at
            # once: it is not progress, so it does not go through the sink (a working commit
            # that the settlement would retire immediately).
            ctx._keep(final)
        return ctx.outcome()


class ToolRegistry:
    """Registered tools by name. Registry presence is not authorization: a call may only
    use a tool its generation offered (``authorize``)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise CommandRejectedError(f"tool {tool.name!r} is registered twice")
            self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self, names: Iterable[str]) -> tuple[ToolSpec, ...]:
        return tuple(self._tools[n].spec for n in names if n in self._tools)

    def authorize(self, name: str, offered: Iterable[str]) -> Tool:
        """The tool for a call, if the generation offered it and it is registered."""
        if name not in set(offered):
            raise ToolArgumentsError(
                f"the model called tool {name!r}, which this generation did not offer"
            )
        tool = self._tools.get(name)
        if tool is None:
            raise ToolArgumentsError(f"tool {name!r} was offered but is not registered")
        return tool
