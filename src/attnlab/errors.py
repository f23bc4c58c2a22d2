"""User-facing errors: a one-paragraph message naming the problem and the fix.

Library code raises ``ValueError``/``TypeError`` for bad arguments; code that touches the user's
files and runs raises :class:`UserError` (or subclasses). The CLI prints either as one paragraph
and exits non-zero; ``--debug`` shows the traceback.

Messages name config fields and function arguments (``warmup_steps=100``), never command-line
flags: a Python caller has no flags. An error also carries the names it blames as data, in
``fields``; the CLI looks them up in its one field-to-flag table (``attnlab.cli.flags``) and adds
the flag to the message.
"""

from __future__ import annotations

from collections.abc import Iterable


class UserError(Exception):
    """A problem the user can fix (missing file, corrupt checkpoint, bad config).

    ``fields``: the config fields or arguments at fault (``("warmup_steps", "steps")``), in the
    order the message names them."""

    exit_code = 2

    def __init__(self, *args: object, fields: Iterable[str] = ()) -> None:
        super().__init__(*args)
        self.fields = tuple(fields)


class CheckpointError(UserError):
    """A checkpoint is missing, truncated, corrupt, or belongs to a different model."""


class ConfigError(UserError):
    """A config file or flag has an unknown key or a bad value."""


class ConfigValueError(ConfigError, ValueError):
    """A bad argument value: a ``ValueError`` to Python callers, naming its ``fields``."""


class DataError(UserError):
    """Input data is missing, empty, undecodable or malformed."""


class ExploreError(UserError):
    """Input the explorer cannot show (empty, too long, unknown head); shown to the user as is."""


class FieldWarning(UserWarning):
    """A warning about settings, carrying the ``fields`` it names (like :class:`UserError`)."""

    def __init__(self, message: str, *, fields: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


def blamed_fields(err: BaseException) -> tuple[str, ...]:
    """The config fields or arguments an error or warning names (empty when it names none)."""
    return tuple(getattr(err, "fields", ()) or ())
