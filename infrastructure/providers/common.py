"""What every HTTP model adapter shares: reading a server's retry-after hint and the
kind of failure an HTTP status is (§8.3). No SDK import here: the adapters pass the
response headers and the status they got."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Literal
from urllib.parse import urlsplit

# A hint longer than this is not honoured as given: a generation task would sleep for
# hours on a misconfigured proxy's header. The retry policy's own delay applies then.
MAX_RETRY_AFTER = 3600.0


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked to wait before the next attempt, or None without a
    usable hint. Reads ``retry-after-ms`` (milliseconds, OpenAI's and Anthropic's
    extension) first, then ``retry-after`` as seconds or as an HTTP date. Header names
    are matched case-insensitively; a negative, non-finite or unparseable value is no
    hint; a value above an hour is no hint either (see ``MAX_RETRY_AFTER``)."""
    if not headers:
        return None
    lowered = {str(name).lower(): str(value) for name, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        seconds = _number(millis)
        if seconds is not None:
            return _bounded(seconds / 1000.0)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return _bounded(seconds)
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return _bounded(max(0.0, when.timestamp() - time.time()))


def classify_status(status: int) -> Literal["retryable", "fatal"]:
    """The kind of failure an HTTP error status is: 408 (timeout), 409 (conflict: the
    vendors use it for a lock), 429 (rate limit) and every 5xx (including the vendors'
    529 overloaded) are worth another attempt; every other status (400, 401, 403, 404,
    413, 422, ...) is fatal: the same request fails the same way. A context-overflow
    400 is recognised by each adapter from the error body, not by its status."""
    if status in (408, 409, 429) or 500 <= status <= 599:
        return "retryable"
    return "fatal"


def _number(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _bounded(seconds: float) -> float | None:
    if seconds > MAX_RETRY_AFTER:
        return None
    return seconds


#: What an API key looks like when a server or a proxy echoes one (OpenAI's ``sk-...``,
#: Anthropic's ``sk-ant-...``): masked even when it is not the adapter's own.
KEY_LIKE = re.compile(r"sk-[A-Za-z0-9_\-*.]{6,}")


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with each of the adapter's ``secrets`` and anything key-like masked: a
    ProviderError's message is stored with the input it failed, forever."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return KEY_LIKE.sub("sk-***", text)


def safe_url(url: object) -> str:
    """An endpoint as a message may name it: scheme, host, port and path; no userinfo,
    no query (either may carry a credential)."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path.rstrip('/')}"


def cause(error: BaseException) -> str:
    """What lies under a transport error (its cause, else itself), for a message."""
    inner = error.__cause__ or error.__context__
    if inner is not None and str(inner):
        return f"{type(inner).__name__}: {inner}"
    return f"{type(error).__name__}: {error}"
