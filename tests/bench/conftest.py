"""What the tests of `pdtop bench --url` share: `stub`, real loopback OpenAI servers (`StubServer`), closed after
the test."""
from __future__ import annotations

import pytest
from openai_stub import StubServer


@pytest.fixture
def stub():
    servers: list[StubServer] = []

    def make(**kw) -> StubServer:
        servers.append(StubServer(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()
