"""The tuning loop: pick a batch of schedules, measure them, log them, learn, repeat.

It tunes any :class:`~weft.compiler.tune.task.TuningTask` (accelerator layers, host kernels):

* ``"random"``: uniform samples of the space without repetition (the baseline);
* ``"xgb"``: :class:`XGBCostModel` is fitted on every measurement so far and :func:`anneal` (simulated
  annealing over the model's scores, several chains) proposes the next batch among unmeasured schedules;
  a share ``epsilon`` of each batch stays random so the model keeps seeing the space (AutoTVM's
  model-based tuner, ``tvm/autotvm/tuner/model_based_tuner.py``). Without a :class:`Transfer` the first
  batch is random; with one (measurements of other workloads on the same target, one ranking group
  each) the model guides from the first trial.

Measurements already in the log (same workload and target) count as trials and are never repeated, so a
run that stops resumes where it was. A measurer with ``measure_many(subject, schedules)`` (a process pool,
:mod:`weft.compiler.tune.parallel`) gets each batch at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.compiler.backend.codegen import BackendError
from weft.compiler.tune.cost_model import XGBCostModel
from weft.compiler.tune.log import TuningLog, task_record
from weft.compiler.tune.task import AccelTask, Space, TuningTask, default_of
from weft.errors import UsageError
from weft.progress import Progress

if TYPE_CHECKING:
    from weft.compiler.tune.measure import Layer, Measurer
    from weft.config import AcceleratorConfig

__all__ = ["TUNERS", "LayerResult", "Transfer", "anneal", "tune_layer", "tune_model", "tune_task",
           "tune_tasks"]

TUNERS = ("xgb", "random")


def anneal(sp: Space, score: Callable[[list[int]], np.ndarray], exclude: set[int], batch: int,
           rng: random.Random, chains: int = 16, steps: int = 60, temp: float = 1.0) -> list[int]:
    """The `batch` best-scored point indices outside `exclude` that simulated annealing visits: `chains`
    walks of `steps` neighbour moves, accepting a worse move with probability exp(delta / T) while T
    cools linearly to 0."""
    cur = [rng.randrange(len(sp)) for _ in range(chains)]
    cur_s = score(cur)
    seen: dict[int, float] = {i: float(s) for i, s in zip(cur, cur_s, strict=True)}
    for step in range(steps):
        t = temp * (1 - step / steps)
        nxt = [sp.index(sp.neighbour(sp.points[i], rng)) for i in cur]
        nxt_s = score(nxt)
        for k, (i, s) in enumerate(zip(nxt, nxt_s, strict=True)):
            seen[i] = float(s)
            delta = float(s - cur_s[k])
            if delta >= 0 or (t > 0 and rng.random() < math.exp(delta / t)):
                cur[k], cur_s[k] = i, s
    ranked = sorted((i for i in seen if i not in exclude), key=lambda i: -seen[i])
    return ranked[:batch]


@dataclass
class Transfer:
    """Measurements of other workloads on the same target, one (features, costs) group each: what the
    cost model knows before a task's first trial."""

    groups: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def add(self, x: np.ndarray, costs: np.ndarray) -> None:
        if len(x) >= 2 and np.ptp(costs) > 0:  # a group with one value has no order to learn
            self.groups.append((np.asarray(x, np.float64), np.asarray(costs, np.float64)))

    def __len__(self) -> int:
        return sum(len(x) for x, _ in self.groups)

    @classmethod
    def from_log(cls, log: TuningLog, task: TuningTask, exclude: set[str] | None = None) -> Transfer:
        """The log's successful records of other workloads on `task`'s target, as `task` featurizes them."""
        out = cls()
        for workload, by in log.others(task.target, (exclude or set()) | {task.workload}).items():
            rows = [(task.features_of(workload, sched), c) for sched, c in by.values()]
            rows = [(f, c) for f, c in rows if f is not None]
            if rows:
                out.add(np.stack([f for f, _ in rows]), np.array([c for _, c in rows], np.float64))
        return out


@dataclass
class LayerResult:
    layer: str
    workload: str
    space: int
    default: Any
    default_cycles: int | None
    best: Any
    best_cycles: int | None
    history: list[int | None] = field(default_factory=list)  # cycles of each trial, in order
    unit: str = "cycles"
    #: Feature rows and costs of this task's successful measurements (what a Transfer learns from).
    features: np.ndarray | None = field(default=None, repr=False)
    costs: np.ndarray | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """The JSON ``weft tune`` prints. ``default_cycles`` / ``best_cycles`` hold the cost in `unit`
        whatever it is (a log reader keys on them); a unit other than cycles (host kernels: "ns") also
        gets keys named for it, ``default_ns`` / ``best_ns``."""
        out = {"layer": self.layer, "space": self.space, "trials": len(self.history), "unit": self.unit,
               "default_cycles": self.default_cycles, "best_cycles": self.best_cycles,
               "best_schedule": _to_dict(self.best), "default_schedule": _to_dict(self.default)}
        if self.unit != "cycles":
            out[f"default_{self.unit}"] = self.default_cycles
            out[f"best_{self.unit}"] = self.best_cycles
        return out

    def line(self) -> str:
        """One line for a person: the layer, its untuned and best cost in its unit, the speedup."""
        if self.best_cycles is None:
            return f"{self.layer}: no schedule measured successfully in {len(self.history)} trials"
        text = f"{self.layer}: best {self.best_cycles:,} {self.unit}"
        if self.default_cycles and self.best_cycles:
            text += (f", untuned {self.default_cycles:,} {self.unit} "
                     f"({self.default_cycles / self.best_cycles:.2f}x faster)")
        return text + f" after {len(self.history)} trials"


def _to_dict(s: Any) -> dict[str, Any] | None:
    return None if s is None else s.to_dict() if hasattr(s, "to_dict") else dict(s)


def tune_task(task: TuningTask, measurer: Measurer, *, trials: int, tuner: str = "xgb",
              log: TuningLog | None = None, seed: int = 0, batch: int = 4, epsilon: float = 0.1,
              progress: Progress | None = None, include_default: bool = True,
              transfer: Transfer | None = None) -> LayerResult:
    """Tune one task for `trials` measurements in all (those already logged included). With
    `include_default` the untuned choice is the first trial, so a tuned layer is never slower than an
    untuned one; the benchmark turns it off to compare the searches alone. `transfer` (xgb only) trains
    the cost model on other workloads' measurements too."""
    if tuner not in TUNERS:
        raise UsageError(f"tuner must be one of {', '.join(TUNERS)}, got '{tuner}'")
    if trials < 1:
        raise UsageError(f"trials must be at least 1, got {trials}")
    log = log if log is not None else TuningLog()
    sp = task.space
    rng = random.Random(seed)
    measured: dict[int, int | None] = {}
    history: list[int | None] = []
    for s, c in log.measured(task.workload, task.target, task.parse).items():
        if s in sp:
            measured[sp.index(s)] = c
            history.append(c)
    model = XGBCostModel(seed=seed) if tuner == "xgb" else None
    prior = transfer if (model is not None and transfer is not None and len(transfer)) else None
    feats: dict[int, np.ndarray] = {}

    def features(idx: list[int]) -> np.ndarray:
        missing = [i for i in idx if i not in feats]
        if missing:
            for i, row in zip(missing, sp.features([sp.points[i] for i in missing]), strict=True):
                feats[i] = row
        return np.stack([feats[i] for i in idx])

    def measure(picks: list[int]) -> None:
        schedules = [sp.points[i] for i in picks]
        if hasattr(measurer, "measure_many"):
            outcomes = measurer.measure_many(task.subject, schedules)
        else:
            outcomes = []
            for s in schedules:
                try:
                    outcomes.append(measurer.measure(task.subject, s))
                except (BackendError, ValueError) as e:  # the back end's own checks refused it
                    outcomes.append(e)
        for i, s, got in zip(picks, schedules, outcomes, strict=True):
            c, err = (None, str(got)) if isinstance(got, Exception) else (int(got), None)
            measured[i] = c
            history.append(c)
            log.add(task_record(task.workload, task.target, task.name, task.to_dict(s), c, measurer.name, err,
                                task.unit))
        if progress is not None:
            best = min((c for c in measured.values() if c is not None), default=None)
            progress.advance(len(history) - progress.done, f"best {best:,} {task.unit}" if best is not None else "")

    default, default_cycles = default_of(task, measurer)
    if include_default and default in sp and sp.index(default) not in measured:
        measure([sp.index(default)])  # draws the bar
    elif progress is not None:
        progress.advance(len(history) - progress.done)
    budget = min(trials, len(sp))
    while len(measured) < budget:
        want = min(batch, budget - len(measured))
        free = [i for i in range(len(sp)) if i not in measured]
        ok = [(i, c) for i, c in measured.items() if c is not None]
        if model is not None and (len(ok) >= 2 or prior is not None):
            xs = [x for x, _ in prior.groups] if prior is not None else []
            ys = [y for _, y in prior.groups] if prior is not None else []
            if ok:
                xs.append(features([i for i, _ in ok]))
                ys.append(np.array([c for _, c in ok], dtype=np.float64))
            model.fit(np.concatenate(xs), np.concatenate(ys), [len(x) for x in xs])
            n_random = sum(rng.random() < epsilon for _ in range(want))
            picks = anneal(sp, lambda idx: model.predict(features(idx)), set(measured), want - n_random, rng)
            rest = [i for i in free if i not in picks]
            picks += rng.sample(rest, min(want - len(picks), len(rest)))
        else:
            picks = rng.sample(free, want)
        measure(picks)
    best = log.best(task.workload, task.target, task.parse)
    ok = [(i, c) for i, c in measured.items() if c is not None]
    return LayerResult(task.name, task.workload, len(sp), default, default_cycles, best[0] if best else None,
                       best[1] if best else None, history, task.unit,
                       features([i for i, _ in ok]) if ok else None,
                       np.array([c for _, c in ok], dtype=np.float64) if ok else None)


def tune_layer(layer: Layer, config: AcceleratorConfig, measurer: Measurer, **options: Any) -> LayerResult:
    """:func:`tune_task` for one accelerator layer (options as there)."""
    return tune_task(AccelTask(layer, config), measurer, **options)


def tune_tasks(tasks: list[TuningTask], measurer: Measurer, *, trials: int, tuner: str = "xgb",
               log: TuningLog | None = None, seed: int = 0, batch: int = 4, show_progress: bool = True,
               include_default: bool = True, transfer: bool = True) -> list[LayerResult]:
    """Tune every distinct workload of `tasks` once (tasks of one workload share their records), in order.
    With `transfer` (xgb), each task's cost model also learns from the log's other workloads on the same
    target and from every task tuned before it in this run."""
    log = log if log is not None else TuningLog()
    results: list[LayerResult] = []
    done: set[str] = set()
    pending = {t.workload for t in tasks}
    prior = Transfer.from_log(log, tasks[0], exclude=pending) if transfer and tasks else Transfer()
    for n, task in enumerate(tasks, 1):
        if task.workload in done:
            continue
        done.add(task.workload)
        bar = Progress(trials, f"[{n}/{len(tasks)}] {task.name}", log_tenths=True) if show_progress else None
        r = tune_task(task, measurer, trials=trials, tuner=tuner, log=log, seed=seed, batch=batch, progress=bar,
                      include_default=include_default, transfer=prior if transfer else None)
        results.append(r)
        if transfer and r.features is not None and r.costs is not None:
            prior.add(r.features, r.costs)
        if bar is not None:
            bar.close()
    return results


def tune_model(layers: list[Layer], config: AcceleratorConfig, measurer: Measurer, **options: Any) -> list[LayerResult]:
    """:func:`tune_tasks` over a model's accelerator layers (options as there)."""
    return tune_tasks([AccelTask(x, config) for x in layers], measurer, **options)
