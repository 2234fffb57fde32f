"""A long-running command's settings as data: each one a flag and an ``$ECHOMQ_*`` variable.

A ``Setting`` is one row: its flag, how a value is read, its default and
where the value goes.  ``add_settings`` puts the rows on a command's parser;
``settle`` (run by ``main`` once the command line is parsed) fills what no
flag gave from the environment, then from the default:

    flag  >  $ECHOMQ_<FLAG>  >  default

A variable that does not parse is a usage error naming it (exit status 2).
The variable's name is the flag's, upper-cased: ``--lease-ms`` is
``$ECHOMQ_LEASE_MS``.  A switch (``--replicas-aof`` / ``--no-replicas-aof``)
reads 1/0, true/false, yes/no, on/off.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def boolean(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected one of {'/'.join(TRUE)} or {'/'.join(FALSE)}, got {value!r}")


@dataclass(frozen=True)
class Setting:
    """One setting of a command: ``--flag`` (and ``short``), ``$ECHOMQ_FLAG``, its type, default and target.

    - ``parse``: reads the flag's value and the variable's (an argparse type:
      raises ``argparse.ArgumentTypeError`` saying what it expected).
    - ``to``: where the value goes: a keyword of the object the command
      makes (``"lease_ms"``), ``"<part>.<keyword>"`` for a part of it
      (``"retry.base_ms"``: a field of the worker's ``RetryPolicy``), or None
      when the command reads it itself.
    - ``shown``: the default as ``--help`` says it, when ``str(default)``
      does not say it well (``"a third of the lease"`` for None).
    - ``switch``: a yes/no setting: ``--flag`` and ``--no-flag``.
    """

    flag: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    to: str | None = None
    short: str | None = None
    shown: str | None = None
    metavar: str | None = None
    choices: Sequence[Any] | None = None
    switch: bool = False

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return "ECHOMQ_" + self.dest.upper()

    def read(self, raw: str) -> Any:
        """The variable's value, as the flag's would be (ArgumentTypeError saying why not)."""
        value = boolean(raw) if self.switch else self.parse(raw)
        if self.choices is not None and value not in self.choices:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(map(str, self.choices))}, got {raw!r}"
            )
        return value


def add_settings(parser: argparse.ArgumentParser, title: str, settings: Sequence[Setting]) -> None:
    """The settings' flags, in a group of their own in ``--help``; ``settle`` fills what is not given."""
    group = parser.add_argument_group(title)
    for s in settings:
        names = [s.flag, *([s.short] if s.short else [])]
        default = s.shown if s.shown is not None else ("on" if s.default is True else str(s.default))
        if s.switch:
            default = "off" if s.default is False else default
        helptext = f"{s.help} (default {default}; ${s.env})"
        if s.switch:
            group.add_argument(
                *names, dest=s.dest, action=argparse.BooleanOptionalAction, default=None, help=helptext
            )
        else:
            group.add_argument(
                *names,
                dest=s.dest,
                type=s.parse,
                default=None,
                metavar=s.metavar,
                choices=s.choices,
                help=helptext,
            )
    parser.set_defaults(settle=lambda args: settle(args, parser, settings))


def settle(args: argparse.Namespace, parser: argparse.ArgumentParser, settings: Sequence[Setting]) -> None:
    """Each setting no flag gave: from its variable if set (non-empty), else its default."""
    for s in settings:
        if getattr(args, s.dest) is not None:
            continue
        raw = os.environ.get(s.env, "")
        if raw == "":
            setattr(args, s.dest, s.default)
            continue
        try:
            setattr(args, s.dest, s.read(raw))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.error(f"${s.env}: {exc}")


def targets(args: argparse.Namespace, settings: Sequence[Setting]) -> dict[str, dict[str, Any]]:
    """The settled values by target: ``{"": {keyword: value}, "retry": {field: value}, ...}``.

    A part's values are only those given (not None), so that an object made
    from them keeps its own defaults for the rest.
    """
    out: dict[str, dict[str, Any]] = {"": {}}
    for s in settings:
        if s.to is None:
            continue
        part, _, name = s.to.rpartition(".")
        value = getattr(args, s.dest)
        if part and value is None:
            continue
        out.setdefault(part, {})[name] = value
    return out
