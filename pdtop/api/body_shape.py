"""A JSON request body's shape (objects and arrays, items, strings) counted before it is parsed.

`json.loads` and pydantic hold the GIL (a worker thread would stall the event loop all the
same), and what they cost grows with the number of values, not of bytes: 8 MB of `[],` takes
`json.loads` 1.75 s, 320,000 empty content parts took the checks 2.4 s. So a body is first
counted, with `str.count` over the text between its strings and one step per string, and
refused (400) past what a request may hold:
- `MAX_CONTAINERS` objects and arrays (messages, content parts, prompts);
- `MAX_ITEMS` items of arrays and members of objects (counted by their commas): a 128K-token
  prompt as token ids, and the rest of the request;
- `MAX_STRINGS` strings, keys included.
Punctuation inside a string is not counted: a prompt of code is one string. The count stops
at the first limit passed, so a hostile body costs at most about `MAX_STRINGS` steps, and no
step holds the GIL for long (the text between strings is counted `WINDOW` characters at a time).
"""
from __future__ import annotations

from json.decoder import scanstring  # type: ignore[attr-defined]  # C, linear; untyped in typeshed

from pdtop.api.errors import bad_request

MAX_CONTAINERS = 4096
MAX_ITEMS = (1 << 17) + 1024
MAX_STRINGS = 1 << 14
WINDOW = 1 << 16  # characters counted at once


def check_shape(text: str) -> None:
    """APIError 400 if the JSON `text` holds more than a request may; malformed JSON passes (its parser
    says what is wrong)."""
    if len(text) <= MAX_CONTAINERS:
        return  # too short to pass any limit
    containers = items = strings = pos = 0
    while True:
        quote = text.find('"', pos)
        end = len(text) if quote < 0 else quote
        for window in range(pos, end, WINDOW):  # between strings, a window at a time: stop at the first too many
            stop = min(end, window + WINDOW)
            containers += text.count("{", window, stop) + text.count("[", window, stop)
            items += text.count(",", window, stop)
            if containers > MAX_CONTAINERS:
                raise _too_many(f"{MAX_CONTAINERS} objects and arrays")
            if items > MAX_ITEMS:
                raise _too_many(f"{MAX_ITEMS} items (numbers, strings, members)")
        if quote < 0:
            return
        strings += 1
        if strings > MAX_STRINGS:
            raise _too_many(f"{MAX_STRINGS} strings")
        try:
            pos = scanstring(text, quote + 1)[1]
        except ValueError:
            return


def _too_many(what: str) -> Exception:
    return bad_request(None, f"the request body holds more than {what}, the most one request may")
