"""A stub HTTP server on loopback that replays scripted responses, for the real provider
SDKs (issue 17): the ``openai`` and ``anthropic`` clients talk real HTTP to it, so what is
tested is their wire format, their retries and their streams, not a mock of them.

    async with StubServer() as stub:
        stub.script(Reply(200, sse=[b'data: {...}\\n\\n', ...]))
        provider = OpenAIProvider(base_url=stub.url + "/v1", api_key="test")
        ...
        assert stub.requests[0].json["model"] == "gpt-test"

Each request takes the next scripted ``Reply`` (an error when none is left: status 599).
A reply is a plain body, or server-sent-event chunks written one by one with chunked
transfer encoding; ``cut_after`` drops the connection after that many chunks (a stream cut
mid-way, no terminating chunk), ``hang`` keeps the stream open after its chunks until the
client goes away (``disconnected`` is then set: an abort reached the server).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Reply", "Seen", "StubServer", "sse"]


def sse(*events: tuple[str | None, Any]) -> list[bytes]:
    """Server-sent-event chunks: each (event name or None, data: a JSON value or a raw
    string such as ``[DONE]``)."""
    out = []
    for name, data in events:
        body = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {body}\n\n".encode())
    return out


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a JSON value (sent as application/json) or bytes
    sse: Sequence[bytes] = ()
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    hang: bool = False
    delay: float = 0.0  # seconds between chunks


@dataclass(frozen=True)
class Seen:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class StubServer:
    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.disconnected = asyncio.Event()
        self.streaming = asyncio.Event()  # set when a hanging stream sent its chunks
        self._replies: list[Reply] = []
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet served."""
        return len(self._replies)

    async def __aenter__(self) -> StubServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Keep-alive connections a client left open end with the server, not with the loop.
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, v = h.decode("latin-1").split(":", 1)
            headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Seen(method, path, headers, body))
        reply = self._replies.pop(0) if self._replies else Reply(599, {"error": "unscripted"})
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        if not reply.sse:
            data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            writer.write(
                f"HTTP/1.1 {reply.status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n{extra}\r\n".encode()
                + data
            )
            await writer.drain()
            return True
        writer.write(
            f"HTTP/1.1 {reply.status} X\r\ncontent-type: text/event-stream\r\n"
            f"transfer-encoding: chunked\r\n{extra}\r\n".encode()
        )
        for n, chunk in enumerate(reply.sse):
            if reply.cut_after is not None and n >= reply.cut_after:
                return False  # the connection drops mid-stream
            if reply.delay:
                await asyncio.sleep(reply.delay)
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        if reply.hang:
            self.streaming.set()
            await reader.read()  # until the client closes its side
            self.disconnected.set()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
