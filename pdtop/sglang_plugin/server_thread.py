"""pdtop's telemetry server on a daemon thread and event loop of its own, inside SGLang's scheduler process.

The scheduler thread never waits for it: records reach it through the server's bounded inbox (the
tap's sinks), and `start` waits only for the port to be bound, once, when the scheduler is set up.
A port in use or a bad address is one warning line, and SGLang runs on without pdtop's server. Beside
it, as beside `pdtop serve`, the hardware sampler publishes the host's and the GPU's figures once a second.
"""
from __future__ import annotations

import asyncio
import logging
import threading

from pdtop.sglang_plugin.settings import Settings
from pdtop.sglang_plugin.tap import SchedulerTap
from pdtop.telemetry.hardware.hw import HwSampler
from pdtop.telemetry.server.server import TelemetryServer

log = logging.getLogger("pdtop.sglang_plugin")
START_TIMEOUT_S = 10.0


class ServerThread:
    def __init__(self, tap: SchedulerTap, settings: Settings) -> None:
        self.tap, self.settings = tap, settings
        self.server: TelemetryServer | None = None
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pdtop-server", daemon=True)

    def start(self) -> bool:
        """Serve; False (and one warning) when the server could not start."""
        logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection in SGLang's log
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            log.warning("pdtop: its server did not start within %.0f s; SGLang runs without it", START_TIMEOUT_S)
            return False
        if self._error is not None:
            log.warning("pdtop: could not serve on %s:%d (%s); SGLang runs without pdtop's server",
                        self.settings.host, self.settings.port, self._error)
            return False
        log.info("pdtop: serving this SGLang scheduler's rounds on %s", self.url)
        return True

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # never let it reach the scheduler's process
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        s = self.settings
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.server = TelemetryServer(self.tap, s.host, s.port, token=s.token)
        try:
            await self.server.start()
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self.url = self.server.url
        extra = self.tap.device.extra
        match = {k: extra[k] for k in ("uuid", "pci_bus_id") if isinstance(extra.get(k), str)}
        sampler = HwSampler(self.server.publish, gpu_match=match or None).start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            sampler.stop()
            await self.server.stop()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (clients get 1001) and wait for the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
