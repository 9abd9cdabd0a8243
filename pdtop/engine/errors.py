"""The engine's exception types: one root, `EngineError`, so callers catch one type.

Every message is one line that a user can act on (the CLI prints it as is), so
each names the file, request, field or limit involved. Programming errors (calling
the runner out of order, say) stay `ValueError`: they are bugs, not bad input.
"""
from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises for bad input or exhausted resources."""


class ModelFileError(EngineError):
    """The model file is missing, unreadable, truncated or not a GGUF file."""


class UnsupportedModelError(EngineError):
    """The file is a valid GGUF, but its architecture or a tensor type is not supported."""


class KVCapacityError(EngineError):
    """The KV cache has no room for the requested tokens; nothing was allocated."""


class PromptError(EngineError):
    """A request is invalid: empty prompt, too long for the context, bad sampling parameters."""


class QueueFullError(EngineError):
    """The waiting queue is at its cap (requests or prompt tokens): the request was refused, nothing queued.

    `retry_after` is a hint in seconds for HTTP clients (the API's `Retry-After`)."""

    def __init__(self, message: str, retry_after: int = 1):
        self.retry_after = retry_after
        super().__init__(message)


class DeviceError(EngineError):
    """The device cannot be used (unknown name, missing driver, no green contexts, bad GPU spec)."""


class FieldError(EngineError):
    """A bad value of a named field: `.field` names it, `.reason` says what is wrong."""

    def __init__(self, field: str, reason: str, prefix: str = ""):
        self.field, self.reason = field, reason
        super().__init__(f"{prefix}{field}: {reason}")


class ConfigError(FieldError):
    """A bad pdmux configuration value (from a file, the constructor or a live override)."""

    def __init__(self, field: str, reason: str, path: str | None = None):
        self.path = path
        super().__init__(field, reason, f"pdmux config {path}: " if path else "pdmux config: ")


class ControlError(FieldError):
    """A refused control message; the engine changed nothing."""
