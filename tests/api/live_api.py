"""`LiveApi`: a real engine and API server on loopback, as `pdtop serve` runs them: the engine runs rounds
on its own thread and the server on an event loop in another."""
from __future__ import annotations

import asyncio
import threading
import time

from pdtop.api.server import ApiServer
from pdtop.engine.records import RequestRecord


class LiveApi:
    """`engine` served at `url` (http://127.0.0.1:PORT/v1); `records` holds every engine record.
    `run_engine=False` leaves the engine stopped: requests queue and never run; `realtime` paces a sim: device
    to wall time (as `pdtop serve`)."""

    def __init__(self, engine, tokenizer, *, run_engine: bool = True, token: str | None = None,
                 realtime: bool = False, **api_options):
        self.engine = engine
        self.records: list = []
        engine.add_sink(self.records.append)
        self.stop = threading.Event()
        self.engine_thread = threading.Thread(target=engine.run, args=(self.stop,), kwargs={"realtime": realtime},
                                              daemon=True)
        if run_engine:
            self.engine_thread.start()
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.api = ApiServer(engine, port=0, token=token, tokenizer=tokenizer, **api_options)
        self._call(self.api.start())
        self.url = self.api.url
        self.root = self.url.removesuffix("/v1")

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def finishes(self, source: str = "api") -> list[RequestRecord]:
        return [r for r in list(self.records) if isinstance(r, RequestRecord) and r.kind == "finish"
                and r.source == source]

    def wait(self, pred, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)

    def wait_kv_free(self) -> None:
        """Until every request's KV is back (an aborted stream ends at the next round boundary)."""
        self.wait(lambda: self.engine.executor.kv_usage()[0] == 0)

    def close(self) -> None:
        self._call(self.api.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(10)
        self.loop.close()
        self.stop.set()
        if self.engine_thread.is_alive():
            self.engine_thread.join(30)
        self.engine.close()
