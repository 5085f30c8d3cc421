"""The error types users see, and how the command line tells them from bugs.

Every error a user can cause (a model, a config, an option, a file, a program, an artifact) is a
:class:`WeftError` and names its culprit; the command line prints it as one line. Anything else is a bug
in weft and keeps its traceback. A few subclasses also derive from ``ValueError`` because callers catch
them as such; :func:`is_user_error` still decides by ``WeftError`` alone.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["InputFileError", "UsageError", "WeftError", "is_user_error", "read_input"]


class WeftError(Exception):
    """Base of errors caused by the user's input (a model, a config, a program, an artifact)."""


class UsageError(WeftError, ValueError):
    """An option or argument weft cannot work with: a value out of range, an unknown name, options that do
    not go together, a config too small for what was asked of it. The message names the culprit."""


class InputFileError(WeftError):
    """A file the user named that cannot be read: missing, a folder, not permitted. ``path`` names it; the
    ``OSError`` is the cause."""

    def __init__(self, path: str | Path, what: str, err: OSError):
        self.path = str(path)
        super().__init__(f"{what} {self.path}: {err.strerror or err}")


def read_input(path: str | Path, what: str) -> bytes:
    """The bytes of the user-named file `path` (`what` says which input it is, e.g. "model"); a file that
    cannot be read raises :class:`InputFileError`."""
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise InputFileError(path, what, err) from err


def is_user_error(err: BaseException) -> bool:
    """True for errors about the input (printed as one line), False for bugs (shown with a traceback)."""
    return isinstance(err, WeftError)
