"""Hooks (§8.8): preparation or observation, never another scheduler.

Hooks run outside the command line; the command that commits re-checks the task's status
and cancellation, so a stale decision is discarded. Hooks may run again after a crash: give
external side effects their own idempotence.

Exception policy (documented and tested):
- preparation hooks fail closed: ``before_request`` raising fails the turn (inputs
  ``failed``); ``before_tool`` raising blocks the call with an error result; ``on_yield``
  raising stops (the answer resolves its inputs, no continuation); ``before_collapse``
  raising declines the collapse;
- observation hooks never block: ``after_response`` raising is logged and ignored;
  ``after_tool`` raising keeps the tool's own result.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from pico.application.model import Deferred, Request, Response
from pico.application.tools import ToolOutcome
from pico.domain.json import JsonObject

__all__ = ["CollapseDecision", "Hooks", "ToolCall", "ToolDecision", "YieldDecision"]

log = logging.getLogger("pico.hooks")


@dataclass(frozen=True)
class ToolCall:
    task_id: int
    call_id: str
    name: str
    arguments: JsonObject


@dataclass(frozen=True)
class ToolDecision:
    """``allow`` (optionally with effective arguments), ``block`` with a result text, or
    ``hold`` for approval (``Harness.decide_approval``)."""

    action: Literal["allow", "block", "hold"] = "allow"
    result: str = ""
    arguments: JsonObject | None = None


@dataclass(frozen=True)
class YieldDecision:
    """After a final answer: ``stop`` (resolve the inputs) or ``continue`` with a message
    that keeps the same input group running."""

    action: Literal["stop", "continue"] = "stop"
    message: str = ""


@dataclass(frozen=True)
class CollapseDecision:
    """``allow`` a context collapse (optionally with summarizer instructions) or
    ``decline`` it."""

    action: Literal["allow", "decline"] = "allow"
    instructions: str = ""


@dataclass
class Hooks:
    before_request: Callable[[Request], Awaitable[Request]] | None = None
    after_response: Callable[[Response | Deferred], Awaitable[None]] | None = None
    before_tool: Callable[[ToolCall], Awaitable[ToolDecision]] | None = None
    after_tool: Callable[[ToolCall, ToolOutcome], Awaitable[ToolOutcome]] | None = None
    on_yield: Callable[[Response], Awaitable[YieldDecision]] | None = None
    before_collapse: Callable[[int], Awaitable[CollapseDecision]] | None = None

    async def observe_response(self, outcome: Response | Deferred) -> None:
        if self.after_response is not None:
            try:
                await self.after_response(outcome)
            except Exception:
                log.warning("after_response hook raised; ignored", exc_info=True)

    async def decide_tool(self, call: ToolCall) -> ToolDecision:
        if self.before_tool is None:
            return ToolDecision()
        try:
            return await self.before_tool(call)
        except Exception as exc:
            return ToolDecision("block", f"blocked: the before_tool hook raised {exc!r}")

    async def process_tool(self, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        if self.after_tool is None:
            return outcome
        try:
            return await self.after_tool(call, outcome)
        except Exception:
            log.warning("after_tool hook raised; the tool's own result is kept", exc_info=True)
            return outcome

    async def decide_collapse(self, conversation_id: int) -> CollapseDecision:
        if self.before_collapse is None:
            return CollapseDecision()
        try:
            return await self.before_collapse(conversation_id)
        except Exception:
            log.warning("before_collapse hook raised; declining", exc_info=True)
            return CollapseDecision("decline")

    async def decide_yield(self, response: Response) -> YieldDecision:
        if self.on_yield is None:
            return YieldDecision()
        try:
            return await self.on_yield(response)
        except Exception:
            log.warning("on_yield hook raised; stopping", exc_info=True)
            return YieldDecision()
