"""OpenTelemetry spans for what a harness does (issue 17): one per command, per task
execution, per provider request (the GenAI semantic conventions) and per tool call.

It depends on ``opentelemetry-api`` only: with no SDK installed, or none configured, every
span is the API's non-recording span and no attribute is built. The semantic-convention
names are string constants here (the semconv package is not a dependency).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from pico.application.model import Deferred, ModelProvider, ProviderError, Request, Response, Usage

if TYPE_CHECKING:
    from pico.application.tools import ToolOutcome
    from pico.domain.values import TaskSnapshot

__all__ = ["Telemetry"]

# GenAI semantic conventions (opentelemetry-semantic-conventions, gen_ai_attributes.py).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_WRITE = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pico-harness")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0"


def provider_name(provider: ModelProvider) -> str:
    """``gen_ai.provider.name``: the provider's ``name`` (``"openai"``, ``"anthropic"``)
    when it has one, else its class name."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


class Telemetry:
    """Where a harness sends its spans.

    Args:
        tracer: the ``opentelemetry.trace.Tracer`` to use. ``None`` (the default) asks the
            global tracer provider for a ``"pico"`` tracer, so an application's
            ``trace.set_tracer_provider(...)`` is honoured, even one set after the harness
            was opened; with none set, nothing is recorded.
        commands: ``False`` records no ``pico.command`` spans (half of a turn's spans, the
            most numerous kind: about half of what recording costs); task executions, model
            requests and tool calls are still traced.
    """

    def __init__(self, tracer: trace.Tracer | None = None, *, commands: bool = True) -> None:
        self.tracer = tracer if tracer is not None else trace.get_tracer("pico", _version())
        self.commands = commands
        # The API's own tracer (a proxy until an SDK's provider is installed, which only
        # makes non-recording spans): a command need not ask it for one, a few per cent
        # of a small command's CPU (issue 16). The proxy tells which tracer it forwards
        # to (``_tracer``) without ``get_tracer_provider``'s read of the environment.
        self._default = tracer is None

    def _untraced(self) -> bool:
        """No SDK installed behind the API's default tracer: every span would be the
        invalid, non-recording one, so none is asked for (a few per cent of a small
        command's CPU, issue 16; nine executions, requests and tool calls a turn)."""
        if not self._default:
            return False
        tracer = self.tracer
        # The proxy forwards to the no-op tracer while it has no real one and no provider
        # is set (what its ``_tracer`` property decides), told here without calling it:
        # ~20 checks a turn, each a Python call from the attribute lookup.
        # (Both private to the API: read defensively, so a release that renames them only
        # takes the property's path below.)
        if (
            getattr(tracer, "_real_tracer", True) is None
            and getattr(trace, "_TRACER_PROVIDER", True) is None
        ):
            return True
        return isinstance(getattr(tracer, "_tracer", None), trace.NoOpTracer)

    def _scope(self, span: Span, *, errors: bool = True) -> AbstractContextManager[Span]:
        """Make ``span`` current until the block ends, then end it. Without an SDK the API
        hands back an invalid, non-recording span: it is not made current at all (nothing
        can record under it), so a harness without tracing pays a span's creation only."""
        if not span.is_recording() and not span.get_span_context().is_valid:
            return _Idle(span)
        return trace.use_span(
            span, end_on_exit=True, record_exception=errors, set_status_on_exception=errors
        )

    # ------------------------------------------------------------------ commands
    def command(self, session_id: str) -> AbstractContextManager[Span]:
        """A span for one command (``pico.command``); ``committed`` fills in the batch."""
        if not self.commands or self._untraced():
            return _IDLE
        span = self.tracer.start_span("pico.command")
        if span.is_recording():
            span.set_attribute("pico.session.id", session_id)
        return self._scope(span)

    @staticmethod
    def committed(span: Span, tx: Any, events: int) -> None:
        """The batch a command committed: its positions, conversations, task and events
        (call only when ``span.is_recording()``)."""
        attributes: dict[str, Any] = {
            "pico.batch.first": tx.first,
            "pico.batch.last": tx.last,
            "pico.events": events,
            "pico.command.scope": "main" if tx.working is None else tx.working.scope_id,
        }
        conversations = sorted(tx.touched)
        if len(conversations) == 1:
            attributes["pico.conversation.id"] = conversations[0]
        elif conversations:
            attributes["pico.conversation.ids"] = conversations
        if tx.task is not None:
            attributes["pico.task.id"] = tx.task
        span.set_attributes(attributes)

    # ------------------------------------------------------------------ task executions
    def task(self, task: TaskSnapshot, mode: str) -> AbstractContextManager[Span]:
        """A span for one execution of a task (``pico.task {kind}``): the status it started
        from; ``ended`` records the status it left the task in."""
        if self._untraced():
            return _IDLE
        span = self.tracer.start_span(f"pico.task {task.kind}")
        if span.is_recording():
            span.set_attributes(
                {
                    "pico.task.id": task.id,
                    "pico.task.kind": task.kind,
                    "pico.task.mode": mode,
                    "pico.task.status.from": task.status,
                    "pico.conversation.id": task.conversation_id,
                }
            )
        return self._scope(span)

    @staticmethod
    def ended(span: Span, status: str | None, failure: BaseException | None) -> None:
        """An execution ended with the task in ``status`` (None: unknown); ``failure`` is
        what it raised (the handle faulted). A task left ``failed`` is an error too."""
        if status is not None:
            span.set_attribute("pico.task.status.to", status)
        if failure is not None:
            span.record_exception(failure)
            span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))
        elif status == "failed":
            span.set_status(Status(StatusCode.ERROR, "the task failed"))

    # ------------------------------------------------------------------ provider requests
    def request(self, provider: ModelProvider, request: Request) -> AbstractContextManager[Span]:
        """A span for one model request (``chat {model}``, GenAI conventions). A
        ``ProviderError`` is recorded with its class (``error.type``, ``pico.retry.class``)
        and known usage, and re-raised."""
        if self._untraced():
            return _IDLE
        span = self.tracer.start_span(f"chat {request.model}", kind=SpanKind.CLIENT)
        if not span.is_recording():
            return self._scope(span)
        span.set_attributes(
            {
                GEN_AI_OPERATION_NAME: "chat",
                GEN_AI_PROVIDER_NAME: provider_name(provider),
                GEN_AI_REQUEST_MODEL: request.model,
            }
        )
        return _requesting(self._scope(span, errors=False), span)

    @staticmethod
    def responded(span: Span, outcome: Response | Deferred | None) -> None:
        """What a request returned: the stop reason and usage; a deferral or a stop."""
        if span is INVALID_SPAN or not span.is_recording():
            return
        if outcome is None:
            span.set_attribute("pico.request.stopped", True)  # the execution's stop signal
        elif isinstance(outcome, Deferred):
            span.set_attribute("pico.request.deferred", True)
            _usage(span, outcome.usage)
        else:
            span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, [outcome.stop_reason])
            _usage(span, outcome.usage)

    # ------------------------------------------------------------------ tool calls
    def tool(self, name: str, call_id: str) -> AbstractContextManager[Span]:
        """A span for one tool invocation (``execute_tool {name}``, GenAI conventions)."""
        if self._untraced():
            return _IDLE
        span = self.tracer.start_span(f"execute_tool {name}")
        if span.is_recording():
            span.set_attributes(
                {
                    GEN_AI_OPERATION_NAME: "execute_tool",
                    GEN_AI_TOOL_NAME: name,
                    GEN_AI_TOOL_CALL_ID: call_id,
                }
            )
        return self._scope(span)

    @staticmethod
    def tool_outcome(span: Span, outcome: ToolOutcome, *, interrupted: bool) -> None:
        """How the invocation ended: ``ok``, ``error``, ``interrupted`` (the execution was
        stopped), ``deferred`` (held for an outside answer) or ``delegated`` (a subagent or
        a job continues it)."""
        if span is INVALID_SPAN or not span.is_recording():
            return
        if outcome.delegation is not None:
            result = "delegated"
        elif outcome.deferred and not outcome.is_error:
            result = "deferred"
        elif interrupted:
            result = "interrupted"
        elif outcome.is_error:
            result = "error"
        else:
            result = "ok"
        span.set_attribute("pico.tool.outcome", result)
        if result in ("error", "interrupted"):
            span.set_attribute(ERROR_TYPE, "pico.tool_error" if result == "error" else result)
            span.set_status(Status(StatusCode.ERROR, f"the tool call ended: {result}"))


class _Idle(AbstractContextManager[Span]):
    """A span that records nothing and is not made current: enter and exit do nothing."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


#: The one idle span context: it holds no state of its own.
_IDLE = _Idle(INVALID_SPAN)


@contextmanager
def _requesting(scope: AbstractContextManager[Span], span: Span) -> Iterator[Span]:
    """A recording request span: a failure is classified on it, then re-raised."""
    with scope:
        try:
            yield span
        except ProviderError as exc:
            span.set_attributes({ERROR_TYPE: f"pico.{exc.kind}", "pico.retry.class": exc.kind})
            _usage(span, exc.usage)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        except Exception as exc:
            span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise


def _usage(span: Span, usage: Usage | None) -> None:
    if usage is None:
        return  # unknown is not zero: no attribute
    attributes: dict[str, Any] = {
        GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
        GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
    }
    if usage.cache_read_tokens:
        attributes[GEN_AI_USAGE_CACHE_READ] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        attributes[GEN_AI_USAGE_CACHE_WRITE] = usage.cache_write_tokens
    span.set_attributes(attributes)
