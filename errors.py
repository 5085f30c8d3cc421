"""The error types users see, and how the command line tells them from bugs."""

from __future__ import annotations

__all__ = ["WeftError", "is_user_error"]


class WeftError(Exception):
    """Base of errors caused by the user's input (a model, a config, a program, an artifact)."""


def is_user_error(err: BaseException) -> bool:
    """True for errors about the input (printed as one line), False for bugs (shown with a traceback)."""
    return isinstance(err, (WeftError, ValueError, OSError, KeyError))
