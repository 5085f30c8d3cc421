"""Measure a batch of schedules in parallel: a pool of worker processes, each with its own measurer.

The tuner hands a whole batch to ``measure_many(subject, schedules)``. Workers are forked, so the subject
(a layer with its graph and weights) is inherited rather than sent: only the schedules travel, and only
cycles or an error message come back. The pool is forked again when the subject changes (once per tuned
layer), which costs milliseconds against seconds of measurement.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from weft.compiler.backend.codegen import BackendError

__all__ = ["PoolMeasurer"]

# What a forked worker measures with: set in the parent just before the fork.
_FACTORY: Callable[[], Any] | None = None
_SUBJECT: Any = None
_WORKER_MEASURER: Any = None


def _measure_in_worker(schedule: Any) -> tuple[int | None, str | None]:
    global _WORKER_MEASURER
    if _WORKER_MEASURER is None:
        assert _FACTORY is not None
        _WORKER_MEASURER = _FACTORY()
    try:
        return int(_WORKER_MEASURER.measure(_SUBJECT, schedule)), None
    except (BackendError, ValueError) as err:  # refused: reported, not raised across the pool
        return None, str(err)


class PoolMeasurer:
    """``measure`` in this process, ``measure_many`` on `jobs` forked workers; `factory()` builds the
    measurer (a TimingMeasurer, say) in each process."""

    def __init__(self, factory: Callable[[], Any], jobs: int) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.factory, self.jobs = factory, jobs
        self.local = factory()
        self.name = self.local.name
        self._pool: ProcessPoolExecutor | None = None
        self._subject: Any = None

    def measure(self, subject: Any, schedule: Any) -> int:
        return self.local.measure(subject, schedule)

    def measure_many(self, subject: Any, schedules: list[Any]) -> list[int | Exception]:
        if self.jobs == 1 or len(schedules) == 1:
            out: list[int | Exception] = []
            for s in schedules:
                try:
                    out.append(self.measure(subject, s))
                except (BackendError, ValueError) as err:
                    out.append(err)
            return out
        if self._pool is None or self._subject is not subject:
            self.close()
            global _FACTORY, _SUBJECT
            _FACTORY, _SUBJECT = self.factory, subject
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"))
            self._subject = subject
        return [ValueError(err) if err is not None else int(c)  # type: ignore[arg-type]
                for c, err in self._pool.map(_measure_in_worker, schedules)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> PoolMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
