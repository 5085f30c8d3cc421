"""A progress bar on stderr for sweeps, tuning and long simulations, and a status line for waits with no
steps to count (a Verilator build, a synthesis run).

No dependency. The bar is quiet when stderr is not a terminal (tests, logs, pipes), so callers never branch
on it; a wait writes a line before and one after there, so a log shows what took the time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

__all__ = ["Progress", "Waiting", "progress"]

T = TypeVar("T")

#: Streams a live bar has left mid-line (drawn with "\r", no newline yet): a wait starts a new line there.
_MID_LINE: set[int] = set()


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
        _MID_LINE.add(id(self.stream))

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            _MID_LINE.discard(id(self.stream))


def progress(items: Iterable[T], label: str, total: int | None = None, *,
             stream: TextIO | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield `items`, advancing a :class:`Progress` bar after each."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, label, stream=stream, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.advance()


class Waiting:
    """``with Waiting("building the RTL simulation of config tiny", "about 80 s"): ...``: a status line.

    On a terminal: the text, its `note` (an estimate, where a log goes) and the seconds so far, redrawn
    every `interval` seconds from a thread, then "done in N s" (or "failed after N s") on the same line.
    Elsewhere: the text and note on a line of their own, then the outcome on another. Whatever the wait
    runs must not write to the stream meanwhile (send a tool's narration to a log file), or the lines mix."""

    def __init__(self, text: str, note: str = "", *, stream: TextIO | None = None, enabled: bool | None = None,
                 interval: float = 1.0):
        self.text = text
        self.head = f"{text} ({note})" if note else text
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Waiting:
        self._started = time.monotonic()
        if id(self.stream) in _MID_LINE:  # under a bar (a sweep synthesizing each point): leave its line be
            self.stream.write("\n")
            _MID_LINE.discard(id(self.stream))
        if self.live:
            self._draw(f"{self.head}... 0s")
            self._thread = threading.Thread(target=self._tick, name="weft-waiting", daemon=True)
            self._thread.start()
        else:
            self.stream.write(f"{self.head}...\n")
            self.stream.flush()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw(f"{self.head}... {time.monotonic() - self._started:.0f}s")

    def _draw(self, text: str) -> None:
        self.stream.write("\r" + text)
        self.stream.flush()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        outcome = "failed after" if kind is not None else "done in"
        line = f"{self.text}: {outcome} {time.monotonic() - self._started:.0f} s"
        if self.live:
            # Pad over the longer "... Ns" text the thread drew last.
            self._draw(line.ljust(len(self.head) + 12) + "\n")
        else:
            self.stream.write(line + "\n")
            self.stream.flush()
