"""The error types users see, and how the command line tells them from bugs.

Every error a user can cause (a model, a config, an option, a file, a program, an artifact) is a
:class:`WeftError` and names its culprit; the command line prints it as one line. Anything else is a bug
in weft and keeps its traceback. A few subclasses also derive from ``ValueError`` because callers catch
them as such; :func:`is_user_error` still decides by ``WeftError`` alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["ConfigError", "UsageError", "UserFileError", "WeftError", "is_user_error", "read_input", "user_file"]


class WeftError(Exception):
    """Base of errors caused by the user's input (a model, a config, a program, an artifact)."""


class ConfigError(WeftError, ValueError):
    """A config that breaks a rule (:mod:`weft.config` and the ISA layout raise it; ``weft.config.ConfigError``
    is the same class). The message names the field and the rule."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"config field '{field_name}': {message}")


class UsageError(WeftError, ValueError):
    """An option or argument weft cannot work with: a value out of range, an unknown name, options that do
    not go together, a config too small for what was asked of it. The message names the culprit."""


class UserFileError(WeftError):
    """A file the user named that cannot be read or written: missing, a folder, not permitted. ``path``
    names it, `what` says which of the command's files it is; the ``OSError`` is the cause."""

    def __init__(self, path: str | Path, what: str, err: OSError):
        self.path = str(path)
        super().__init__(f"{what} {self.path}: {err.strerror or err}")


@contextmanager
def user_file(path: str | Path, what: str) -> Iterator[None]:
    """Reads or writes of the user-named file `path` inside the block: an ``OSError`` there becomes a
    :class:`UserFileError` naming it. Keep the block to that one file, or another file's fault is blamed
    on it."""
    try:
        yield
    except OSError as err:
        raise UserFileError(path, what, err) from err


def read_input(path: str | Path, what: str) -> bytes:
    """The bytes of the user-named file `path` (`what` says which input it is, e.g. "model")."""
    with user_file(path, what):
        return Path(path).read_bytes()


def is_user_error(err: BaseException) -> bool:
    """True for errors about the input (printed as one line), False for bugs (shown with a traceback)."""
    return isinstance(err, WeftError)
