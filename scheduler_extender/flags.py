"""Command-line help that says each setting's default and environment variable.

Both CLIs mirror their pydantic-settings fields as flags; the help of a flag whose destination
is a settings field is completed from the field (its description, default and
``<PREFIX><NAME>`` variable), so no flag is left without them. Errors print one line and a
pointer to ``--help`` instead of the whole usage.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line."""

    def error(self, message: str) -> NoReturn:
        """``prog: message (see --help)`` on stderr, exit status 2."""
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | dict | tuple) and not value:
        return "none"
    return str(value)


def describe_settings(parser: argparse.ArgumentParser, model: type[BaseModel], prefix: str) -> None:
    """Complete the help of every flag that sets a field of ``model``."""
    fields = model.model_fields
    for action in parser._actions:
        field = fields.get(action.dest)
        if field is None or action.help == argparse.SUPPRESS:
            continue
        text = action.help or field.description or ""
        default = field.default
        if default is not PydanticUndefined and default is not None:
            text += f" (default: {_shown(default)})"
        text += f" [${prefix}{action.dest.upper()}]"
        action.help = text.strip().replace("%", "%%")
