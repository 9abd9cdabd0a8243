"""A connection as the server keeps it (`Client`), and how the stream reaches every connection
(`fan_out`): the same encoded text for all, as one `batch` frame written straight to the
socket of a caught-up batch client, else through the client's bounded queue and writer task.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection, broadcast

from pdtop.telemetry.encode import encode
from pdtop.telemetry.events import PROTOCOL_VERSION, Dropped
from pdtop.telemetry.server.client_queue import ClientQueue
from pdtop.telemetry.server.rate import TokenBucket

DIRECT_WRITE_LIMIT = 32 * 1024  # websockets' default high-water mark: above it, queue instead
CONTROL_RATE, CONTROL_BURST = 20.0, 40.0  # control messages a second per connection


@dataclass(eq=False)
class Client:
    """The server's record of one connection."""

    id: str
    ws: ServerConnection
    queue: ClientQueue
    authorized: bool  # may send control messages
    batch: bool  # asked for `batch` frames
    host: str = ""  # the peer's address: where its wrong tokens are counted (`TokenGate`)
    shed_base: int = 0  # the inbox's shed count when it connected: what was shed before is not its loss
    frames_sent: int = 0
    closing: bool = False  # being closed for not reading: its messages are no longer handled
    waiting: int = 0  # its engine commands whose outcome the engine has not given yet
    messages: TokenBucket = field(default_factory=lambda: TokenBucket(CONTROL_RATE, CONTROL_BURST))


def fan_out(clients: list[Client], frames: list[str], shed_before: int, shed_total: int) -> None:
    """The same text to every client. A batch client that is caught up (nothing queued,
    little unsent) gets its batch written straight to its socket in one `broadcast` call,
    no task switch; every other client's frames go through its queue and writer task.
    A client is told only of events shed since it connected."""
    shed = shed_total - shed_before
    direct: list[ServerConnection] = []
    batch = None
    for client in clients:
        if client.closing:
            continue
        q = client.queue
        lost = shed_total - max(shed_before, client.shed_base)
        if client.batch and not q and lost == shed and _unsent(client.ws) < DIRECT_WRITE_LIMIT:
            direct.append(client.ws)
            client.frames_sent += 1
            continue
        if lost > 0:
            q.lose(lost)
        if not frames:
            continue
        if client.batch:
            batch = batch or _batch(frames)
            q.put(batch, len(frames))
        else:
            for frame in frames:
                q.put(frame)
    if direct:
        lost_note = [encode(Dropped(shed))] if shed else []
        broadcast(direct, _batch(lost_note + frames))


def _batch(frames: list[str]) -> str:
    return f'{{"type":"batch","v":{PROTOCOL_VERSION},"events":[{",".join(frames)}]}}'


def _unsent(ws: ServerConnection) -> int:
    """Bytes written to the socket's transport but not yet sent (huge if it is gone)."""
    try:
        return ws.transport.get_write_buffer_size()
    except Exception:
        return 1 << 62
