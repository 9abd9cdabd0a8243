"""The plain-HTTP reader of /metrics (`scrape/http_get.py`) against a raw loopback server: chunked bodies,
a kept connection the server closed meanwhile, and bounds; and the page parse's cache of series."""
from __future__ import annotations

import asyncio

import pytest

from pdtop.telemetry.scrape.http_get import ClosedMidAnswer, NotHttp, PlainHttp, TooBig
from pdtop.telemetry.scrape.page import read_page

PAGE = b'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'


async def raw_server(answers: list[bytes], close_after: bool = False):
    """Answers each request on a connection with the next of `answers` (the last again)."""
    served = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionResetError):
                break
            writer.write(answers[min(len(served), len(answers) - 1)])
            served.append(1)
            await writer.drain()
            if close_after:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], served


def chunked(body: bytes, size: int = 16) -> bytes:
    parts = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size))
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n" + parts + b"0\r\n\r\n"


async def test_chunked_bodies_kept_connections_and_bounds():
    server, port, served = await raw_server([chunked(PAGE)])
    client = PlainHttp("127.0.0.1", port, "/metrics", {}, max_bytes=1 << 20)
    try:
        for _ in range(3):
            answer = await client.get()
            assert answer.status == 200 and answer.body == PAGE and answer.headers["content-type"] == "text/plain"
        assert len(served) == 3
        small = PlainHttp("127.0.0.1", port, "/metrics", {}, max_bytes=10)
        with pytest.raises(TooBig):
            await small.get()
    finally:
        await client.close()
        server.close()


async def test_a_connection_the_server_closed_is_opened_again_and_bad_answers_say_so():
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
    server, port, _ = await raw_server([answer], close_after=True)
    client = PlainHttp("127.0.0.1", port, "/metrics", {}, max_bytes=1 << 20)
    try:
        assert (await client.get()).body == PAGE
        assert (await client.get()).body == PAGE  # the kept connection was closed: a new one
    finally:
        await client.close()
        server.close()
    for raw, error in ((b"SSH-2.0-OpenSSH_9.6\r\n\r\n", NotHttp), (b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nab",
                                                                      ClosedMidAnswer)):
        server, port, _ = await raw_server([raw], close_after=True)
        client = PlainHttp("127.0.0.1", port, "/metrics", {}, max_bytes=1 << 20)
        try:
            with pytest.raises(error):
                await client.get()
        finally:
            await client.close()
            server.close()


def test_the_parse_cache_gives_the_parsers_samples():
    text = ('vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
            'vllm:num_requests_waiting{model_name="a}b",engine="0"} 2.0\n'  # a } in a value: the parser reads it
            'vllm:kv_cache_usage_perc{model_name="m",engine="0"} NaN\n')
    first, again = read_page(text), read_page(text.replace("3.0", "4.0"))
    assert [(s.name, s.labels) for s in first.samples] == [(s.name, s.labels) for s in again.samples]
    assert again.samples[0].value == 4.0 and again.samples[1].labels["model_name"] == "a}b"
    assert again.samples[2].value != again.samples[2].value  # NaN
