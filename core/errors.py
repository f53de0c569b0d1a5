"""The exceptions decoctl raises. Every message names the thing that is wrong and the fix."""

from __future__ import annotations

__all__ = [
    "AbiError",
    "CapabilityError",
    "ConfigError",
    "ControllerError",
    "DecoctlError",
    "GenerationError",
    "GeneratorInUseError",
    "ModelLoadError",
    "PluginError",
    "SequenceError",
]


class DecoctlError(Exception):
    """Base class of every error decoctl raises on purpose."""


class ModelLoadError(DecoctlError):
    """A model folder is missing, corrupt, or in a layout decoctl does not know."""


class CapabilityError(DecoctlError):
    """A primitive needs something the model (or the host) does not provide."""


class PluginError(DecoctlError):
    """A plugin is unknown, conflicts with another, or broke its contract."""


class ConfigError(DecoctlError):
    """An option, run file or command-line value is invalid."""


class SequenceError(DecoctlError):
    """A primitive was called with arguments that do not fit the sequence (rewind past the end, overflow)."""


class AbiError(DecoctlError):
    """A shared-library controller could not be loaded or returned an error status."""


class ControllerError(DecoctlError):
    """A controller broke the decode contract (for example a step that made no progress)."""


class GeneratorInUseError(DecoctlError):
    """A Generator was asked for a generation while another one held its models: from another thread at the same
    time, or an unfinished stream resumed after a newer generation on the same Generator had taken them over."""


class GenerationError(DecoctlError):
    """A generation stopped on an error; what was generated before it is kept.

    ``text`` and ``tokens`` hold the output committed before the failure, ``stats`` the statistics so far;
    the original exception is ``__cause__``.
    """

    def __init__(self, message: str, *, text: str, tokens: list[int], stats: object) -> None:
        super().__init__(message)
        self.text = text
        self.tokens = tokens
        self.stats = stats
