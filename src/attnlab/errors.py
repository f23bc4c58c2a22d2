"""User-facing errors: a one-paragraph message naming the problem and the fix.

Library code raises ``ValueError``/``TypeError`` for bad arguments; code that touches the user's
files and runs raises :class:`UserError` (or subclasses). The CLI prints either as one paragraph
and exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix (missing file, corrupt checkpoint, bad config)."""

    exit_code = 2


class CheckpointError(UserError):
    """A checkpoint is missing, truncated, corrupt, or belongs to a different model."""


class ConfigError(UserError):
    """A config file or flag has an unknown key or a bad value."""


class DataError(UserError):
    """Input data is missing, empty, undecodable or malformed."""


class ExploreError(UserError):
    """Input the explorer cannot show (empty, too long, unknown head); shown to the user as is."""
