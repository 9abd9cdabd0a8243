"""A small keep-alive HTTP/1.1 GET over asyncio streams, for reading `/metrics` over plain http://.

httpx costs about 3 ms of CPU a request here, more than parsing a server's page; a fleet reads 16
pages a second. This reads one URL again and again on one connection: a status line, headers, and a
body by Content-Length, chunked, or up to the server's close, never more than `max_bytes`. Redirects
are not followed (the status says so). https:// stays with httpx.

Framing is checked as RFC 9112 writes it: a status of three ASCII digits, a Content-Length of ASCII
digits, a chunk size of at most 16 hex digits on a line of at most `MAX_CHUNK_LINE` bytes; anything else
(`Content-Length: ²`, status `²00`, chunk size `-5`, a 64 KiB chunk-size line) is `NotHttp`, which the
source reports and retries like a refused connection.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

MAX_HEAD = 64 << 10
MAX_CHUNK_LINE = 4 << 10  # a chunk size and its extensions
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")


class TooBig(Exception):
    """The body is over `max_bytes`."""


class ClosedMidAnswer(Exception):
    """The server closed the connection before the whole answer came."""


class NotHttp(Exception):
    """The answer is not HTTP/1.x; the message says what was wrong."""


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


class PlainHttp:
    def __init__(self, host: str, port: int, target: str, headers: dict[str, str], max_bytes: int) -> None:
        lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.host, self.port, self.max_bytes = host, port, max_bytes
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> Answer:
        """One GET; a kept connection the server closed meanwhile is opened again once."""
        reused = self._streams is not None
        try:
            return await self._get()
        except ClosedMidAnswer as exc:
            if not reused or not exc.args or exc.args[0] != "before the answer":
                raise
        return await self._get()

    async def _get(self) -> Answer:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD)
        reader, writer = self._streams
        try:
            writer.write(self.request)
            await writer.drain()
            answer, keep = await self._read(reader)
        except BaseException:
            await self.close()
            raise
        if not keep:
            await self.close()
        return answer

    async def _read(self, reader: asyncio.StreamReader) -> tuple[Answer, bool]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise ClosedMidAnswer("before the answer" if not exc.partial else "in the headers") from None
        except asyncio.LimitOverrunError:
            raise NotHttp("headers over 64 KiB") from None
        except ConnectionResetError:
            raise ClosedMidAnswer("before the answer") from None
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or \
                not set(parts[1].encode("latin-1")) <= _DIGITS:
            raise NotHttp(f"not an HTTP answer: {status_line[:60]!r}")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        status = int(parts[1])
        keep = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        if status != 200:  # the body is not read: the connection goes
            return Answer(status, parts[2] if len(parts) > 2 else "", headers, b""), False
        try:
            body, keep_after = await self._body(reader, headers)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            raise ClosedMidAnswer("in the body") from None
        return Answer(status, parts[2] if len(parts) > 2 else "", headers, body), keep and keep_after

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> tuple[bytes, bool]:
        chunks: list[bytes]
        length = headers.get("content-length", "")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks, size = [], 0
            while True:
                try:
                    line = await reader.readuntil(b"\r\n")
                except asyncio.LimitOverrunError:
                    raise NotHttp("a chunk-size line over 64 KiB") from None
                digits = line.split(b";")[0].strip()
                if len(line) > MAX_CHUNK_LINE or not 0 < len(digits) <= 16 or not set(digits) <= _HEX:
                    raise NotHttp(f"a chunked body with a bad chunk size ({digits[:20]!r})")
                n = int(digits, 16)
                if n == 0:
                    await reader.readuntil(b"\r\n")  # (no trailers from these servers)
                    return b"".join(chunks), True
                size += n
                if size > self.max_bytes:
                    raise TooBig
                chunks.append(await reader.readexactly(n))
                if await reader.readexactly(2) != b"\r\n":
                    raise NotHttp("a chunk without its CRLF")
        if length:
            if len(length) > 18 or not set(length.encode("latin-1")) <= _DIGITS:
                raise NotHttp(f"a bad Content-Length ({length[:20]!r})")
            if int(length) > self.max_bytes:
                raise TooBig
            return await reader.readexactly(int(length)), True
        chunks, size = [], 0  # to the close
        while chunk := await reader.read(1 << 16):
            size += len(chunk)
            if size > self.max_bytes:
                raise TooBig
            chunks.append(chunk)
        return b"".join(chunks), False

    async def close(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                pass
