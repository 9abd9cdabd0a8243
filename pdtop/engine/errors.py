"""The engine's exception types.

Every message is one line that a user can act on (the CLI prints it as is), so
each names the file, request or limit involved.
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
