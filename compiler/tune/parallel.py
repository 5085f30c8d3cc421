"""Measure schedules in parallel: a pool of worker processes, each with its own measurer.

The tuner hands a whole batch to ``measure_many(subject, schedules)``; ``measure_pairs`` takes schedules
of several subjects at once (a benchmark's random searches, whose choices do not depend on what they
measure). Workers are forked, so the subjects (layers with their graph and weights) are inherited rather
than sent: only an index and a schedule travel, and only cycles or an error message come back. The pool
is forked again when a new subject appears (once per tuned layer), which costs milliseconds against
seconds of measurement.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from weft.compiler.backend.codegen import BackendError
from weft.errors import UsageError

__all__ = ["PoolMeasurer"]

# What a forked worker measures with: set in the parent just before the fork.
_FACTORY: Callable[[], Any] | None = None
_SUBJECTS: list[Any] = []
_WORKER_MEASURER: Any = None
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Pool initializer: a worker ends when the process that forked it dies (killed, say), instead of
    measuring on as an orphan. Linux delivers SIGKILL on the parent's death; elsewhere a thread polls."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_poll_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _poll_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _measure_in_worker(job: tuple[int, Any]) -> tuple[int | None, str | None]:
    global _WORKER_MEASURER
    if _WORKER_MEASURER is None:
        assert _FACTORY is not None
        _WORKER_MEASURER = _FACTORY()
    subject, schedule = job
    try:
        return int(_WORKER_MEASURER.measure(_SUBJECTS[subject], schedule)), None
    except (BackendError, ValueError) as err:  # refused: reported, not raised across the pool
        return None, str(err)


class PoolMeasurer:
    """``measure`` in this process, ``measure_many``/``measure_pairs`` on `jobs` forked workers; `factory()`
    builds the measurer (a TimingMeasurer, say) in each process."""

    def __init__(self, factory: Callable[[], Any], jobs: int) -> None:
        if jobs < 1:
            raise UsageError(f"jobs must be at least 1, got {jobs}")
        self.factory, self.jobs = factory, jobs
        self.local = factory()
        self.name = self.local.name
        self._pool: ProcessPoolExecutor | None = None
        self._subjects: list[Any] = []  # what the current pool's workers inherited

    def measure(self, subject: Any, schedule: Any) -> int:
        return self.local.measure(subject, schedule)

    def measure_many(self, subject: Any, schedules: list[Any]) -> list[int | Exception]:
        return self.measure_pairs([(subject, s) for s in schedules])

    def measure_pairs(self, pairs: list[tuple[Any, Any]]) -> list[int | Exception]:
        """Cycles (or the refusal) of each (subject, schedule), in order."""
        if self.jobs == 1 or len(pairs) == 1:
            out: list[int | Exception] = []
            for subject, s in pairs:
                try:
                    out.append(self.measure(subject, s))
                except (BackendError, ValueError) as err:
                    out.append(err)
            return out
        index = {id(x): k for k, x in enumerate(self._subjects)}
        if self._pool is None or any(id(subject) not in index for subject, _ in pairs):
            self.close()
            global _FACTORY, _SUBJECTS
            for subject, _ in pairs:
                if id(subject) not in index:
                    index[id(subject)] = len(self._subjects)
                    self._subjects.append(subject)
            _FACTORY, _SUBJECTS = self.factory, self._subjects
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_die_with_parent, initargs=(os.getpid(),))
        jobs = [(index[id(subject)], s) for subject, s in pairs]
        return [ValueError(err) if err is not None else int(c)  # type: ignore[arg-type]
                for c, err in self._pool.map(_measure_in_worker, jobs)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> PoolMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
