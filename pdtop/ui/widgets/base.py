"""Base class of the panels: a bordered Static that repaints from the state on the tick."""
from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Static

from pdtop.ui.state import DashboardState
from pdtop.ui.themes import PDTOP_COLOURS, variable


class Panel(Static):
    """A panel; subclasses implement `render_state` (a Group of one-line Texts, or any renderable).

    The app calls `paint` on its tick. A repaint is skipped when `paint_key` and the size
    and theme are unchanged, or when the lines come out the same; a layout pass is asked
    for only when the number of lines changed. Panels with `LINE_API = True` (the big
    charts) hand Textual ready-made strips through `render_line` instead of a renderable,
    which skips Rich's layout of every cell on every repaint.
    """

    TITLE = ""
    LINE_API = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_key: Any = None
        self._last_lines = -1
        self._last_texts: list[Any] = []
        self._strips: list[Strip] = []
        self._last_state: DashboardState | None = None

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    def on_resize(self, _event: events.Resize) -> None:
        """Paint what is shown again at the new size: the app's tick repaints on new events, and a paused
        replay or a frozen screen has none (a narrower terminal kept the wide picture, cut)."""
        if self._last_state is not None:
            self.paint(self._last_state, force=True)

    def colour(self, key: str) -> str:
        """One of pdtop's theme colours ("prefill", "decode", "idle", "slo", "chart") or a Textual one."""
        name = variable(key) if key in PDTOP_COLOURS else key
        return self.app.theme_variables.get(name) or PDTOP_COLOURS.get(key, "white")

    @property
    def inner_width(self) -> int:
        return max(10, self.content_size.width or 40)

    @property
    def inner_height(self) -> int:
        return max(1, self.content_size.height or 6)

    def paint_key(self, state: DashboardState) -> Any:
        """What decides this panel's picture; by default every event changes it."""
        return state.version

    def paint(self, state: DashboardState, force: bool = False) -> None:
        self._last_state = state
        key = (self.paint_key(state), self.content_size, self.app.theme)
        if key == self._last_key and not force:
            return
        self._last_key = key
        renderable = self.render_state(state)
        lines = -1
        if isinstance(renderable, Group):
            lines = len(renderable.renderables)
            for line in renderable.renderables:  # one line each: cut, never wrap
                if isinstance(line, Text):
                    line.no_wrap, line.overflow = True, "ellipsis"
            texts = list(renderable.renderables)
            if not force and texts == self._last_texts:
                return  # same picture: spare the compositor
            old, self._last_texts = self._last_texts, texts
            if self.LINE_API:
                self._paint_lines(texts, old, force)
                return
        self.update(renderable, layout=lines != self._last_lines)
        self._last_lines = lines

    def _paint_lines(self, texts: list[Any], old: list[Any], force: bool) -> None:
        """Line API: rebuild and mark dirty only the lines that changed (a chart's last column)."""
        width = self.content_size.width
        console, base = self.app.console, self.rich_style
        same_shape = not force and len(old) == len(texts) == len(self._strips) and \
            all(s.cell_length == width for s in self._strips[:1])
        if not same_shape:
            self._strips = [text_strip(t, width, console, base) for t in texts]
            self.refresh()
            return
        for y, (new, was) in enumerate(zip(texts, old, strict=True)):
            if new != was:
                self._strips[y] = text_strip(new, width, console, base)
                self.refresh(Region(0, y, width, 1))

    def render_line(self, y: int) -> Strip:
        if not self.LINE_API:
            return super().render_line(y)
        if 0 <= y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.content_size.width, self.rich_style)

    def render_state(self, state: DashboardState) -> RenderableType:
        raise NotImplementedError


def text_strip(text: Text, width: int, console: Any, base: Style) -> Strip:
    """One line of Text as a Strip of exactly `width` cells over the `base` style.

    Texts built by appending (ordered, non-overlapping spans) become segments directly;
    anything else goes through Rich's renderer.
    """
    plain, spans = text.plain, text.spans
    outer = base + _style(console, text.style)
    segments: list[Segment] = []
    pos = 0
    for span in spans:
        if span.start < pos:  # overlapping spans: let Rich combine them
            segments = [Segment(seg.text, base + seg.style if seg.style else base, seg.control)
                        for seg in text.render(console, end="")]
            break
        if span.start > pos:
            segments.append(Segment(plain[pos:span.start], outer))
        segments.append(Segment(plain[span.start:span.end], outer + _style(console, span.style)))
        pos = span.end
    else:
        if pos < len(plain):
            segments.append(Segment(plain[pos:], outer))
    strip = Strip(segments)
    if strip.cell_length < width:
        return Strip([*segments, Segment(" " * (width - strip.cell_length), base)], width)
    if strip.cell_length > width > 0:  # cut, and said to be: never a figure that silently lost its end
        cut = list(strip.crop(0, width - 1))
        return Strip([*cut, Segment("…", cut[-1].style if cut else base)], width)
    return strip


def _style(console: Any, style: str | Style | None) -> Style:
    if not style:
        return _NULL
    return style if isinstance(style, Style) else console.get_style(style)


_NULL = Style()
