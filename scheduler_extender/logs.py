"""One log line per record: control characters in a message are written escaped.

A pod name with a newline or a terminal escape, sent by a client, cannot forge a log line.
Standard library only; the node agent uses it too.
"""

from __future__ import annotations

import logging
import re

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class OneLineFormatter(logging.Formatter):
    """A formatter that escapes control characters in the message and its arguments.

    A traceback, which the handler appends after the message, keeps its own lines.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, with the message's control characters escaped."""
        record.message = _CONTROL.sub(_escape, record.message)
        return super().formatMessage(record)


def setup(level: str) -> None:
    """Log to stderr at ``level``, one line per record."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    if level != "debug":  # httpx logs every request at INFO: one line per push
        logging.getLogger("httpx").setLevel(logging.WARNING)
