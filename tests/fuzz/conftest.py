"""Print how many fuzz cases ran, after the run's summary."""

from __future__ import annotations

import pytest

from tests.fuzz.test_openapi import SUMMARY


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    line = config.stash.get(SUMMARY, None)
    if line:
        terminalreporter.write_line(line)
