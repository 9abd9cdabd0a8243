"""Following a server's log as `tail -F` does: a file by name, or a pipe (standard input) by descriptor.

Each `read_lines()` returns the whole lines written since the last call, never blocking: a line still
being written waits for its newline; a line over `MAX_LINE` bytes is dropped (noise, not SGLang's).
A file is read from its start (the start-up line is at the top), at most `MAX_READ` bytes a call, and
followed across rotation (renamed away and a new file made: the old one is read to its end first) and
truncation (`copytruncate`: read again from the start). A file that is not there yet is waited for.
"""
from __future__ import annotations

import os

MAX_LINE = 64 << 10
MAX_READ = 4 << 20  # per call: a huge old log is caught up over several calls


class LogFollower:
    def __init__(self, path: str | None = None, fd: int | None = None) -> None:
        """Follow the file at `path`, or the pipe open as `fd` (made non-blocking)."""
        if (path is None) == (fd is None):
            raise ValueError("give a path or a descriptor")
        self.path, self.name = path, path or "standard input"
        self._fd: int | None = fd
        self._inode: tuple[int, int] | None = None
        self._pos = 0
        self._partial = b""
        self._skipping = False  # inside an overlong line: drop up to its newline
        self.ended = False  # the pipe closed (a file never ends: it may grow)
        self.problem: str | None = None  # why nothing can be read now, in one line
        self.rotations = 0
        if fd is not None:
            os.set_blocking(fd, False)

    def read_lines(self) -> list[str]:
        if self.path is None:
            return self._split(self._read_pipe())
        return self._split(self._read_file())

    def close(self) -> None:
        if self._fd is not None and self.path is not None:
            os.close(self._fd)
        self._fd = None

    def _read_pipe(self) -> bytes:
        if self._fd is None or self.ended:
            return b""
        chunks, size = [], 0
        while size < MAX_READ:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                self.problem, self.ended = f"cannot read {self.name}: {exc.strerror or exc}", True
                break
            if not chunk:
                self.ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    def _read_file(self) -> bytes:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc.strerror or exc} (waiting for it)"
            return self._drain_old()
        out = b""
        if self._fd is not None and (st.st_dev, st.st_ino) != self._inode:  # rotated: finish the old file
            out = self._drain_old()
            self.rotations += 1
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                self.problem = f"cannot read {self.path}: {exc.strerror or exc}"
                return out
            self._inode, self._pos = (st.st_dev, st.st_ino), 0
        if st.st_size < self._pos:  # truncated in place
            self._pos, self._partial, self._skipping = 0, b"", False
            self.rotations += 1
        self.problem = None
        return out + self._read_from_fd(MAX_READ - len(out))

    def _drain_old(self) -> bytes:
        if self._fd is None:
            return b""
        data = self._read_from_fd(MAX_READ)
        os.close(self._fd)
        self._fd, self._inode = None, None
        if (self._partial + data)[-1:] not in (b"", b"\n"):  # the old file's last line had no newline: it is whole
            data += b"\n"
        return data

    def _read_from_fd(self, limit: int) -> bytes:
        assert self._fd is not None
        try:
            data = os.pread(self._fd, max(0, limit), self._pos)
        except OSError as exc:
            self.problem = f"cannot read {self.name}: {exc.strerror or exc}"
            return b""
        self._pos += len(data)
        return data

    def _split(self, data: bytes) -> list[str]:
        if not data:
            return []
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[str] = []
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            if len(raw) <= MAX_LINE:
                out.append(raw.decode("utf-8", errors="replace"))
        if len(self._partial) > MAX_LINE:
            self._partial, self._skipping = b"", True
        return out
