"""Command lines made from pydantic-settings models: one flag per setting, no mirror to keep.

``SettingsCli`` puts pydantic-settings' own CLI source on an argparse parser that also holds the
command's actions (``--version``, ``--once``): each setting becomes ``--kebab-name`` (booleans
``--x``/``--no-x``, lists comma-separated, mappings ``KEY=VALUE`` repeated), its help says its
default and ``<PREFIX><NAME>`` variable, and a flag wins over its variable. Errors print one line
and a pointer to ``--help`` instead of the whole usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import Generic, NoReturn, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsError

S = TypeVar("S", bound=BaseSettings)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line."""

    def error(self, message: str) -> NoReturn:
        """``prog: message (see --help)`` on stderr, exit status 2."""
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


class SettingsCli(Generic[S]):
    """A command's parser: its own flags (added to ``parser`` first), then one per setting."""

    def __init__(
        self,
        model: type[S],
        *,
        prog: str,
        description: str,
        env_prefix: str,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.parser = Parser(prog=prog, description=description)
        self._prefix = env_prefix
        self._aliases = dict(aliases or {})
        """Other names of settings' flags (``--policy`` for ``--policy-file``)."""
        self._own: list[str] = []
        self._source: CliSettingsSource[S] | None = None

    def flag(self, *names: str, **kwargs: object) -> None:
        """Add one of the command's own flags (not a setting)."""
        action = self.parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]
        if action.default is not argparse.SUPPRESS:  # --version and --help leave no value
            self._own.append(action.dest)

    def _settings_source(self) -> CliSettingsSource[S]:
        if self._source is None:
            self._source = CliSettingsSource(
                self.model,
                root_parser=self.parser,
                cli_prog_name=self.parser.prog,
                cli_kebab_case=True,
                cli_implicit_flags=True,
            )
            _name_variables(self.parser, self.model.model_fields, self._prefix)
        return self._source

    def parse(self, argv: Iterable[str] | None = None) -> tuple[S, argparse.Namespace]:
        """The settings (flags over variables) and the command's own flags.

        Raises pydantic's ``ValidationError`` or pydantic-settings' ``SettingsError``.
        """
        source = self._settings_source()
        args = sys.argv[1:] if argv is None else list(argv)
        ns = self.parser.parse_args([self._canonical(a) for a in args])
        own = argparse.Namespace(**{dest: getattr(ns, dest) for dest in self._own})
        for dest in self._own:
            delattr(ns, dest)
        return self.model(_cli_settings_source=source(parsed_args=ns)), own

    def _canonical(self, arg: str) -> str:
        name, eq, value = arg.partition("=")
        return self._aliases.get(name, name) + eq + value if name.startswith("--") else arg

    def parse_or_report(
        self, argv: Iterable[str] | None = None, hints: Mapping[str, str] | None = None
    ) -> tuple[S, argparse.Namespace] | None:
        """``parse``, or None once every problem is written to stderr, one a line.

        A setting's ``hints`` entry is appended to its problems.
        """
        try:
            return self.parse(argv)
        except SettingsError as exc:
            sys.stderr.write(f"{self.parser.prog}: {exc}\n")
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                where = ".".join(map(str, err["loc"])) or "settings"
                hint = (hints or {}).get(where, "")
                sys.stderr.write(f"{self.parser.prog}: {where}: {err['msg']}{hint}\n")
        return None


def _name_variables(parser: argparse.ArgumentParser, fields: Iterable[str], prefix: str) -> None:
    """Add each setting's environment variable to its flag's help."""
    names = set(fields)
    for action in parser._actions:
        if action.dest in names and action.help != argparse.SUPPRESS:
            action.help = f"{action.help or ''} [${prefix}{action.dest.upper()}]".strip()
