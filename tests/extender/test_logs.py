"""A client's text with a newline or terminal escapes cannot forge a log line."""

import logging

from scheduler_extender.logs import FORMAT, OneLineFormatter


def test_control_characters_in_a_message_and_its_arguments_are_escaped():
    formatter = OneLineFormatter(FORMAT)
    name = "p\n2026-12-05 00:00:00 INFO scheduler_extender: bound evil\x1b[2J\u2028x"
    record = logging.LogRecord("scheduler_extender", logging.INFO, __file__, 1,
                               "filter %s: %s", (name, "ok\r"), None)  # fmt: skip
    line = formatter.format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert "p\\n2026-12-05" in line and "\\x1b[2J" in line and line.endswith("ok\\r")


def test_a_traceback_keeps_its_lines():
    formatter = OneLineFormatter(FORMAT)
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(record)
    assert text.splitlines()[0].endswith("failed") and "Traceback" in text
