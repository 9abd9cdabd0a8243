"""The engine's exception types: one-line messages meant for the user."""


class EngineError(Exception):
    """Base of every error the engine reports to a user."""


class ModelFileError(EngineError):
    """The model file is missing, unreadable, truncated or not a GGUF."""


class UnsupportedModelError(EngineError):
    """The file is a GGUF, but of an architecture or tensor type pdtop cannot run."""


class PromptError(EngineError):
    """An empty prompt, or one longer than the context allows."""


class KVCapacityError(EngineError):
    """The KV cache has no room for the request; nothing was changed."""
