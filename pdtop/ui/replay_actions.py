"""The replay transport's keys (play/pause, step, seek, speed), on the source's `Transport`."""
from __future__ import annotations

from pdtop.ui.dispatch import DispatchApp

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


class ReplayActions(DispatchApp):
    def action_replay_toggle(self) -> None:
        t = self.source.transport
        if t is None:
            return
        if t.at_end:  # play again from the start
            t.seek(0.0)
            t.resume()
        elif t.paused:
            t.resume()
        else:
            t.pause()
        self.repaint_soon()

    def action_replay_step(self) -> None:
        if (t := self.source.transport) is not None:
            t.step()
            self.repaint_soon()

    def action_replay_seek(self, position: float) -> None:
        if (t := self.source.transport) is not None:
            t.seek(position)
            self.repaint_soon()

    def action_replay_seek_relative(self, delta: float) -> None:
        if (t := self.source.transport) is not None:
            self.action_replay_seek(t.position + delta)

    def action_replay_speed(self, direction: int) -> None:
        t = self.source.transport
        if t is None:
            return
        options = [s for s in SPEEDS if (s > t.speed if direction > 0 else s < t.speed)]
        if not options:
            self.notify(f"speed stays {t.speed:g}x (0.25x to 16x)", severity="warning", timeout=2)
            return
        t.speed = min(options) if direction > 0 else max(options)
        self.repaint_soon()
