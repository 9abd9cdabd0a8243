"""Where a client may ask the server to record: a new file inside the recordings directory.

A client's `RecordStart` comes over the network, so its path is confined: relative to the directory
(or absolute inside it), no `..`, every directory on the way opened without following a
symlink, and the file created new (O_EXCL: an existing file, or a symlink planted in its
place, is refused, never overwritten or followed). Errors name the client's own path,
never where the recordings directory is.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import BinaryIO

from pdtop.telemetry.recording.recorder import RecordingError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def recordings_dir(path: str | Path | None) -> Path:
    """The directory, resolved once (default: the working directory); ValueError if it is not one."""
    resolved = Path(path if path is not None else os.getcwd()).resolve()
    if not resolved.is_dir():
        raise ValueError(f"the recordings directory {str(path)!r} is not a directory")
    return resolved


def open_new_in(directory: Path, requested: str) -> tuple[Path, BinaryIO]:
    """Create `requested` inside `directory` (from `recordings_dir`) and open it for writing."""
    parts = _parts_inside(directory, requested)
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise RecordingError(f"cannot open the recordings directory: {exc.strerror}") from None
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise RecordingError(f"{requested!r}: {part!r} is not a directory inside the recordings "
                                     f"directory ({exc.strerror})") from None
            os.close(fd)
            fd = inner
        try:
            file_fd = os.open(parts[-1], _NEW_FILE_FLAGS, 0o644, dir_fd=fd)
        except FileExistsError:
            raise RecordingError(f"{requested!r} already exists; recordings are never overwritten") from None
        except OSError as exc:
            raise RecordingError(f"cannot write recording {requested!r}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return directory.joinpath(*parts), os.fdopen(file_fd, "wb")


def _parts_inside(directory: Path, requested: str) -> tuple[str, ...]:
    if "\x00" in requested:
        raise RecordingError("a file path cannot hold a NUL character")
    outside = RecordingError(f"{requested!r} is outside the recordings directory")  # not saying where it is
    path = PurePath(os.path.normpath(requested))
    if path.is_absolute():
        try:
            path = path.relative_to(directory)
        except ValueError:
            raise outside from None
    parts = tuple(p for p in path.parts if p != ".")
    if not parts:
        raise RecordingError(f"{requested!r} names no file")
    if ".." in parts:
        raise outside
    return parts
