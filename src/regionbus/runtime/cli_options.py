"""What every ``regionbus`` command shares (click): options that read a setting's environment
variable and show it in ``--help``, the logging options of the long-running commands, and
the one way a :class:`RegionBusError` reaches the terminal.

An option made by :func:`setting_option` reads the same variable its settings field reads
(``RegionBusSettings.env_name``), so ``--help`` names the variable without hand-written
text, and the option, the variable and the settings cannot disagree.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any, Final

import click
from confluent_kafka import KafkaException

from regionbus.runtime.observability import LogFormat, configure_logging
from regionbus.runtime.redis_connect import REDIS_ERRORS
from regionbus.schemas.errors import ConfigurationError, RegionBusError, TransportError
from regionbus.schemas.settings import RegionBusSettings
from regionbus.schemas.settings_docs import setting_descriptions
from regionbus.schemas.transport import kafka_error

CONFIGURATION_EXIT_CODE: Final = 2
"""Exit status of a command refused for its configuration (click's usage-error status)."""

LOG_FORMAT_ENV: Final = "REGIONBUS_LOG_FORMAT"
"""The variable of ``--log-format`` for commands whose settings have no ``log_format``."""

_SENTENCE_END: Final = re.compile(r"(?<!e\.g)(?<!i\.e)(?<=[a-z0-9)`\]])\.\s")


def _first_sentence(text: str) -> str:
    plain = text.replace("``", "")
    found = _SENTENCE_END.search(plain)
    return plain[: found.start() + 1] if found else plain


def setting_option(
    settings_class: type[RegionBusSettings], field: str, *param_decls: str, **attrs: Any
) -> Callable[[Any], Any]:
    """A click option that sets one settings field.

    Args:
        settings_class: The settings class the command builds.
        field: The field the option sets; it is also the keyword the command receives.
        *param_decls: The option's names, e.g. ``"--kafka"``.
        **attrs: Further ``click.option`` arguments. ``envvar`` defaults to the field's
            variable (``settings_class.env_name(field)``) with ``show_envvar``; ``help`` to
            the first sentence of the field's documentation.

    Returns:
        The option's decorator.

    Raises:
        KeyError: ``field`` is not a field of ``settings_class``.
    """
    if field not in settings_class.model_fields:  # a typo fails at import, not in use
        raise KeyError(f"{settings_class.__name__} has no field {field!r}")
    attrs.setdefault("envvar", settings_class.env_name(field))
    attrs.setdefault("show_envvar", True)
    if "help" not in attrs:
        attrs["help"] = _first_sentence(setting_descriptions(settings_class).get(field, ""))
    return click.option(*param_decls, field, **attrs)


def logging_options(
    settings_class: type[RegionBusSettings] | None = None,
) -> Callable[[Any], Any]:
    """``-v/--verbose`` and ``--log-format`` for a long-running command.

    Args:
        settings_class: The command's settings when they have a ``log_format`` field (its
            variable is the option's); None: ``REGIONBUS_LOG_FORMAT``.

    Returns:
        A decorator adding both options (keywords ``verbose`` and ``log_format``).
    """
    if settings_class is not None and "log_format" in settings_class.model_fields:
        log_format = setting_option(
            settings_class,
            "log_format",
            "--log-format",
            type=click.Choice(["text", "json"]),
            help="Log lines as text, or as one JSON object per line.",
        )
    else:
        log_format = click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            envvar=LOG_FORMAT_ENV,
            show_envvar=True,
            help="Log lines as text, or as one JSON object per line.",
        )
    verbose = click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")

    def decorate(func: Any) -> Any:
        return verbose(log_format(func))

    return decorate


def with_logging(level: int = logging.INFO) -> Callable[[Any], Any]:
    """:func:`logging_options` for a command that has no settings of its own: the command
    gets neither keyword; logging is configured before it runs.

    Args:
        level: The root logger's level without ``-v`` (``-v``: DEBUG). A command that draws
            a progress bar passes WARNING, so that only what needs a reader interrupts it.
    """

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def run(*args: Any, verbose: bool, log_format: LogFormat, **kwargs: Any) -> Any:
            configure_logging(log_format, verbose=verbose)
            if not verbose:
                logging.getLogger().setLevel(level)
            return func(*args, **kwargs)

        return logging_options()(run)

    return decorate


class JsonListOrWords(click.ParamType):
    """The type of a repeatable option whose variable is a JSON list, as the settings read
    it (``REGIONBUS_REGIONS='["flights", "airports"]'``); a value that is not JSON is split
    at white space, as click splits a repeatable option's variable."""

    name = "text"

    def split_envvar_value(self, rv: str) -> list[str]:
        if not rv.lstrip().startswith("["):
            return rv.split()
        try:
            items = json.loads(rv)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not a JSON list: {exc}") from exc
        if not isinstance(items, list):
            raise click.BadParameter("not a JSON list")
        return [str(item) for item in items]


class CommandError(click.ClickException):
    """A command failed: ``Error: <message>`` on stderr, exit status 1."""


class ConfigurationCommandError(CommandError):
    """A command's configuration was refused: exit status :data:`CONFIGURATION_EXIT_CODE`."""

    exit_code = CONFIGURATION_EXIT_CODE


def command_error(exc: RegionBusError) -> CommandError:
    """The :class:`CommandError` a regionbus error becomes at the command line.

    A :class:`ConfigurationError` exits 2 with its message as is (one line per problem);
    any other error exits 1 with its message on one line.
    """
    if isinstance(exc, ConfigurationError):
        return ConfigurationCommandError(str(exc))
    return CommandError(" ".join(str(exc).split()) or type(exc).__name__)


class RegionBusGroup(click.Group):
    """The ``regionbus`` group: a :class:`RegionBusError` raised by any command below it
    becomes :func:`command_error` (one line, exit 1 or 2), never a traceback. A Redis or
    Kafka error that escaped its translation counts as the :class:`TransportError` it
    stands for."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RegionBusError as exc:
            raise command_error(exc) from exc
        except REDIS_ERRORS as exc:
            raise command_error(TransportError(f"Redis: {type(exc).__name__}: {exc}")) from exc
        except KafkaException as exc:
            raise command_error(kafka_error(exc, "Kafka")) from exc


__all__ = [
    "CONFIGURATION_EXIT_CODE",
    "LOG_FORMAT_ENV",
    "CommandError",
    "ConfigurationCommandError",
    "JsonListOrWords",
    "RegionBusGroup",
    "command_error",
    "logging_options",
    "setting_option",
    "with_logging",
]
