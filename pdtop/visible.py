"""Text that came from outside (a server, a file, a log) made safe to show: its control characters
written as escapes.

A hostile `/metrics` label, a redirect's `Location`, a recording's model name or a server's error body
may hold terminal escapes: OSC 0 sets the window title, OSC 52 writes the clipboard, CSI sequences move
the cursor or clear the screen. Everything pdtop shows from outside, on the dashboard and on stderr,
goes through `visible` first: every character that is not printable (C0 and C1 controls, DEL, line
breaks, bidirectional overrides and other format characters) becomes its Python escape (`\\x1b`,
`\\n`, `\\u202e`), so it is seen, not obeyed; printable text of any script is left as it is.
"""
from __future__ import annotations


def visible(text: str, limit: int | None = None) -> str:
    """`text` with its control characters written as escapes; cut to `limit` characters (with `...`)
    first, when given, so a huge value costs no more than what is shown."""
    if limit is not None and len(text) > limit:
        text = text[:max(0, limit - 3)] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
