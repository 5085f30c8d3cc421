"""A progress bar on stderr for sweeps, tuning and long simulations.

No dependency, and quiet when stderr is not a terminal (tests, logs, pipes), so callers never branch on it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

__all__ = ["Progress", "progress"]

T = TypeVar("T")


class Progress:
    """``with Progress(total, "sweep") as bar: ... bar.advance()``: a one-line bar, redrawn at most 10x/s.

    With `log_tenths`, a stream that is not a terminal (a log file of a long tuning run) gets one line
    each time another tenth of `total` is done instead of nothing."""

    def __init__(self, total: int | None, label: str, *, stream: TextIO | None = None,
                 enabled: bool | None = None, width: int = 30, log_tenths: bool = False):
        self.total = total
        self.label = label
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.log_tenths = log_tenths and not self.enabled
        self.width = width
        self.note = ""
        self._started = time.monotonic()
        self._drawn = 0.0
        self._width = 0
        self._logged = -1  # the last tenth a log line was written for

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, steps: int = 1, note: str | None = None) -> None:
        """Count `steps` more done; `note` (shown after the bar, e.g. the current item) replaces the last."""
        self.done += steps
        if note is not None:
            self.note = note
        now = time.monotonic()
        if self.enabled and (now - self._drawn >= 0.1 or self.done == self.total):
            self._drawn = now
            self._draw(now)
        elif self.log_tenths and self.total:
            tenth = min(self.done, self.total) // max(1, self.total // 10)
            if tenth > self._logged:
                self._logged = tenth
                self.stream.write(self._text(now) + "\n")
                self.stream.flush()

    def _text(self, now: float) -> str:
        elapsed = now - self._started
        if self.total:
            filled = self.width * min(self.done, self.total) // self.total
            bar = "#" * filled + "." * (self.width - filled)
            text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:.0f}s"
        else:
            text = f"{self.label} {self.done} {elapsed:.0f}s"
        return f"{text} {self.note}" if self.note else text

    def _draw(self, now: float) -> None:
        text = self._text(now)
        # Pad over what a longer previous line left.
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


def progress(items: Iterable[T], label: str, total: int | None = None, *,
             stream: TextIO | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield `items`, advancing a :class:`Progress` bar after each."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, label, stream=stream, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.advance()
