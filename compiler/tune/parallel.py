"""Measure schedules in parallel: a pool of worker processes, each with its own measurer.

The tuner hands a whole batch to ``measure_many(subject, schedules)``; ``measure_pairs`` takes schedules
of several subjects at once (a benchmark's random searches, whose choices do not depend on what they
measure). Workers are forked, so the subjects (layers with their graph and weights) are inherited rather
than sent: only an index and a schedule travel, and only cycles or an error message come back. The pool
is forked again when a new subject appears (once per tuned layer), which costs milliseconds against
seconds of measurement.
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
_SUBJECTS: list[Any] = []
_WORKER_MEASURER: Any = None


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
            raise ValueError(f"jobs must be at least 1, got {jobs}")
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
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"))
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
