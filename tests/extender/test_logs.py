"""A client's text with a newline or terminal escapes cannot forge a log line."""

import logging
import sys

from scheduler_extender import logs
from scheduler_extender.api.server import uvicorn_options
from scheduler_extender.logs import FORMAT, OneLineFormatter


def test_control_characters_in_a_message_and_its_arguments_are_escaped():
    formatter = OneLineFormatter(FORMAT)
    name = "p\n2026-12-05 00:00:00 INFO scheduler_extender: bound evil\x1b[2J\u2028x"
    record = logging.LogRecord("scheduler_extender", logging.INFO, __file__, 1,
                               "filter %s: %s", (name, "ok\r"), None)  # fmt: skip
    line = formatter.format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert "p\\n2026-12-05" in line and "\\x1b[2J" in line and line.endswith("ok\\r")


def test_a_traceback_is_written_on_the_records_one_line_with_its_newlines_escaped():
    formatter = OneLineFormatter(FORMAT)
    try:
        raise ValueError("bad\n2026-12-05 00:00:00 INFO scheduler_extender: forged \x1b[2J")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(record)
    assert "\n" not in text and "\x1b" not in text
    assert "failed\\nTraceback (most recent call last):\\n" in text
    assert text.endswith(
        "ValueError: bad\\n2026-12-05 00:00:00 INFO scheduler_extender: forged \\x1b[2J"
    )


def test_other_unicode_is_written_as_it_is():
    formatter = OneLineFormatter(FORMAT)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "gpu %s", ("Radeon™ 昇腾",), None)
    assert formatter.format(record).endswith("gpu Radeon™ 昇腾")


def test_every_line_of_an_agent_names_its_node_and_uvicorn_speaks_the_same_format():
    logs.setup("info", "edge-3")
    try:
        (handler,) = logging.getLogger().handlers
        lines = [
            handler.format(logging.LogRecord(name, level, __file__, 1, msg, args, None))
            for name, level, msg, args in (
                ("node_agent", logging.ERROR, "gpu %d: fatal xid %d", (0, 79)),
                ("uvicorn.error", logging.INFO, "Started server process", ()),
            )
        ]
    finally:
        logs.setup("warning")
    assert lines[0].endswith(" ERROR node_agent edge-3: gpu 0: fatal xid 79"), lines
    assert lines[1].endswith(" INFO uvicorn.error edge-3: Started server process"), lines
    # uvicorn configures no logging of its own: its records reach the root handler above.
    assert uvicorn_options()["log_config"] is None
