"""Text as edgegpu writes it out: control characters escaped, and one log line per record.

What counts as a control character is defined here once: the log formatter and ``kubectl
edgegpu`` write them escaped, and the telemetry contract refuses them in what a report names.
A pod name with a newline or a terminal escape, sent by a client, can neither forge a log line
nor drive the terminal of whoever reads it. Standard library only; the node agent uses it too.
"""

from __future__ import annotations

import logging
import re

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
r"""A regular-expression character class (without its brackets), in a syntax both Python's
``re`` and pydantic's Rust engine read: C0 (newline and ESC among them), DEL, C1 (``\x9b`` is
a CSI on its own), the line and paragraph separators, and the bidirectional marks, embeddings,
overrides and isolates (text that reads other than it is)."""

CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape(text: str) -> str:
    r"""``text`` with each control character written as its Python escape.

    ESC becomes ``\x1b``, a newline ``\n``, U+202E ``\u202e``; everything else, other
    unicode included, is left as it is.
    """
    return CONTROL.sub(_escape, text)


class OneLineFormatter(logging.Formatter):
    r"""A formatter whose every record is one line: control characters are escaped.

    The message, its arguments and an exception's traceback alike: a newline in a value, or
    between a traceback's lines, is written ``\n``.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, with its control characters escaped."""
        return escape(super().format(record))


def setup(level: str, node: str | None = None) -> None:
    """Log to stderr at ``level``, one line per record.

    Every line names ``node`` if given (the agent's node: many agents' lines end up in one
    place).
    """
    handler = logging.StreamHandler()
    form = FORMAT
    if node:
        form = FORMAT.replace("%(name)s:", "%(name)s " + escape(node).replace("%", "%%") + ":")
    handler.setFormatter(OneLineFormatter(form))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    if level != "debug":  # httpx logs every request at INFO: one line per push
        logging.getLogger("httpx").setLevel(logging.WARNING)
