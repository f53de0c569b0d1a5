"""decoctl's loggers: structlog events routed through the standard logging module.

decoctl is a library: it writes nothing to stdout or stderr unless the application configures logging. Every
event goes to the stdlib logger named after the module that logs it, under the "decoctl" logger (a plugin's
``decoctl_eagle.controller`` logs as ``decoctl.decoctl_eagle.controller``), which carries a NullHandler, so an
unconfigured program prints nothing, not even warnings (the stdlib's convention for libraries). The event
becomes the record's message, ``event key=value ...``. structlog's global configuration is neither changed nor
used, so an application's own structlog setup stays its own; the one exception is
``structlog.testing.capture_logs()``, which sees decoctl's events as documented.

    from decoctl.logs import get_logger

    log = get_logger(__name__)
    log.info("decoctl.thing_done", thing="x")
"""

from __future__ import annotations

import logging
from typing import Any, cast

import structlog
from structlog.stdlib import BoundLogger, filter_by_level
from structlog.testing import LogCapture
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["LOGGER", "get_logger", "logger_name"]

LOGGER = "decoctl"
"""The stdlib logger every decoctl event goes through (set its level or give it a handler to see them)."""

logging.getLogger(LOGGER).addHandler(logging.NullHandler())


def logger_name(module: str) -> str:
    """The stdlib logger a module's events go to: ``module`` itself inside decoctl, else under "decoctl"."""
    return module if module == LOGGER or module.startswith(LOGGER + ".") else f"{LOGGER}.{module}"


def _captured(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Hand the event to structlog's configured processors while ``capture_logs()`` has put a LogCapture there
    (which then drops it); otherwise pass it on untouched. capture_logs() captures every level, so this runs
    before the level filter."""
    configured = structlog.get_config()["processors"]
    if configured and isinstance(configured[-1], LogCapture):
        for processor in configured:
            event_dict = processor(logger, method_name, event_dict)
    return event_dict


def _value(value: Any) -> str:
    """A string as it is unless quoting keeps it one token (empty, or with spaces); anything else as its repr."""
    if not isinstance(value, str):
        return repr(value)
    return repr(value) if not value or any(c.isspace() for c in value) else value


def _message(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> tuple[tuple[str], dict[str, Any]]:
    """The record's message, ``event key=value ...`` (keys sorted), and the stdlib call's keyword arguments."""
    del logger, method_name
    kwargs = {key: event_dict.pop(key) for key in ("exc_info", "stack_info") if key in event_dict}
    event = str(event_dict.pop("event", ""))
    fields = " ".join(f"{key}={_value(value)}" for key, value in sorted(event_dict.items()))
    return ((f"{event} {fields}" if fields else event),), kwargs


_PROCESSORS: list[Processor] = [_captured, filter_by_level, _message]


def get_logger(name: str) -> BoundLogger:
    """A structlog logger whose events go to the stdlib logger ``logger_name(name)``; use ``__name__``."""
    return cast(
        BoundLogger,
        structlog.wrap_logger(
            logging.getLogger(logger_name(name)),
            processors=_PROCESSORS,
            wrapper_class=BoundLogger,
            cache_logger_on_first_use=True,
        ),
    )
