"""The tuning loop: pick a batch of schedules, measure them, log them, learn, repeat.

* ``"random"``: uniform samples of the space without repetition (the baseline);
* ``"xgb"``: the first batch at random, then :class:`XGBCostModel` is fitted on every measurement so far
  and :func:`anneal` (simulated annealing over the model's scores, several chains) proposes the next
  batch among unmeasured schedules; a share ``epsilon`` of each batch stays random so the model keeps
  seeing the space (AutoTVM's model-based tuner, ``tvm/autotvm/tuner/model_based_tuner.py``).

Measurements already in the log (same workload and config) count as trials and are never repeated, so a
run that stops resumes where it was.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from weft.compiler.backend.codegen import BackendError
from weft.compiler.backend.schedule import Schedule, ranked
from weft.compiler.tune.cost_model import XGBCostModel
from weft.compiler.tune.log import TuningLog, record, workload_key
from weft.compiler.tune.space import SearchSpace

if TYPE_CHECKING:
    from weft.compiler.tune.measure import Layer, Measurer
    from weft.config import AcceleratorConfig

__all__ = ["TUNERS", "LayerResult", "Progress", "anneal", "tune_layer", "tune_model"]

TUNERS = ("xgb", "random")


class Progress:
    """A dependency-free progress bar on stderr (redrawn in place on a terminal, one line per update else)."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0

    def update(self, done: int, note: str = "") -> None:
        tty = getattr(self.stream, "isatty", lambda: False)()
        step = max(1, self.total // 10)
        if not tty and done % step and done < self.total:  # a log file gets a line per tenth, not per trial
            return
        self.done = done
        filled = int(self.width * min(done, self.total) / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        end = "\r" if tty else "\n"
        self.stream.write(f"{self.label} [{bar}] {done}/{self.total} {note}{end}")
        self.stream.flush()

    def close(self) -> None:
        if getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")


def anneal(sp: SearchSpace, score: Callable[[list[int]], np.ndarray], exclude: set[int], batch: int,
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
class LayerResult:
    layer: str
    workload: str
    space: int
    default: Schedule
    default_cycles: int | None
    best: Schedule | None
    best_cycles: int | None
    history: list[int | None] = field(default_factory=list)  # cycles of each trial, in order

    def summary(self) -> dict[str, Any]:
        return {"layer": self.layer, "space": self.space, "trials": len(self.history),
                "default_cycles": self.default_cycles, "best_cycles": self.best_cycles,
                "best_schedule": self.best.to_dict() if self.best else None,
                "default_schedule": self.default.to_dict()}


def _default(layer: Layer, config: AcceleratorConfig, measurer: Measurer) -> tuple[Schedule, int | None]:
    """What the back end picks without a log (the first ranked schedule that lowers) and its cycles."""
    candidates = ranked(layer.geom, config)
    for s in candidates[:32]:
        try:
            return s, measurer.measure(layer, s)
        except (BackendError, ValueError):
            continue
    return candidates[0], None


def tune_layer(layer: Layer, config: AcceleratorConfig, measurer: Measurer, *, trials: int, tuner: str = "xgb",
               log: TuningLog | None = None, seed: int = 0, batch: int = 4, epsilon: float = 0.1,
               progress: Progress | None = None, include_default: bool = True) -> LayerResult:
    """Tune one layer for `trials` measurements in all (those already logged included). With
    `include_default` the back end's own choice is the first trial, so a tuned layer is never slower than
    an untuned one; the benchmark turns it off to compare the searches alone."""
    if tuner not in TUNERS:
        raise ValueError(f"tuner must be one of {', '.join(TUNERS)}, got '{tuner}'")
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    log = log if log is not None else TuningLog()
    g = layer.geom
    sp = SearchSpace(g, config)
    key = workload_key(g)
    rng = random.Random(seed)
    measured: dict[int, int | None] = {}
    history: list[int | None] = []
    for s, c in log.measured(key, config.hash).items():
        if s in sp:
            measured[sp.index(s)] = c
            history.append(c)
    model = XGBCostModel(seed=seed) if tuner == "xgb" else None
    feats: dict[int, np.ndarray] = {}

    def features(idx: list[int]) -> np.ndarray:
        missing = [i for i in idx if i not in feats]
        if missing:
            for i, row in zip(missing, sp.features([sp.points[i] for i in missing]), strict=True):
                feats[i] = row
        return np.stack([feats[i] for i in idx])

    def measure(i: int) -> None:
        s = sp.points[i]
        try:
            c: int | None = measurer.measure(layer, s)
            err = None
        except (BackendError, ValueError) as e:  # the back end's own checks refused it
            c, err = None, str(e)
        measured[i] = c
        history.append(c)
        log.add(record(g, config, s, c, measurer.name, err))

    default, default_cycles = _default(layer, config, measurer)
    if include_default and default in sp and sp.index(default) not in measured:
        measure(sp.index(default))
    budget = min(trials, len(sp))
    if progress is not None:
        progress.update(len(history))
    while len(measured) < budget:
        want = min(batch, budget - len(measured))
        free = [i for i in range(len(sp)) if i not in measured]
        ok = [(i, c) for i, c in measured.items() if c is not None]
        if model is not None and len(ok) >= 2:
            model.fit(features([i for i, _ in ok]), np.array([c for _, c in ok], dtype=np.float64))
            n_random = sum(rng.random() < epsilon for _ in range(want))
            picks = anneal(sp, lambda idx: model.predict(features(idx)), set(measured), want - n_random, rng)
            rest = [i for i in free if i not in picks]
            picks += rng.sample(rest, min(want - len(picks), len(rest)))
        else:
            picks = rng.sample(free, want)
        for i in picks:
            measure(i)
            if progress is not None:
                best = min((c for c in measured.values() if c is not None), default=None)
                progress.update(len(history), f"best {best}" if best is not None else "")
    best = log.best(key, config.hash)
    return LayerResult(g.name, key, len(sp), default, default_cycles, best[0] if best else None,
                       best[1] if best else None, history)


def tune_model(layers: list[Layer], config: AcceleratorConfig, measurer: Measurer, *, trials: int,
               tuner: str = "xgb", log: TuningLog | None = None, seed: int = 0, batch: int = 4,
               show_progress: bool = True, include_default: bool = True) -> list[LayerResult]:
    """Tune every distinct workload of `layers` once (layers of one shape share their records)."""
    log = log if log is not None else TuningLog()
    results, done = [], set()
    for n, layer in enumerate(layers, 1):
        key = workload_key(layer.geom)
        if key in done:
            continue
        done.add(key)
        bar = Progress(trials, f"[{n}/{len(layers)}] {layer.geom.name}") if show_progress else None
        results.append(tune_layer(layer, config, measurer, trials=trials, tuner=tuner, log=log, seed=seed,
                                  batch=batch, progress=bar, include_default=include_default))
        if bar is not None:
            bar.close()
    return results
