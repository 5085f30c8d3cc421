"""`weft bench tune`: trials to reach 95% of the best-found cycles, XGBoost vs random search, over seeds,
on a model's conv layers; and tuned vs default cycles of the tuned layers (timing model).

Each distinct workload is measured through a cache shared by every run (measurements are deterministic),
so several seeds cost little more than one. The best found is the best any run of that layer measured.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from weft.compiler.backend.codegen import BackendError
from weft.compiler.backend.schedule import Schedule
from weft.compiler.tune.log import workload_key
from weft.compiler.tune.measure import Layer, TimingMeasurer, layers_of
from weft.compiler.tune.tuner import tune_layer

__all__ = ["bench_tune"]


class _Cached:
    """A measurer that remembers (failures included)."""

    def __init__(self, inner: TimingMeasurer) -> None:
        self.inner, self.name = inner, inner.name
        self.cache: dict[tuple[str, Schedule], int | Exception] = {}

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        key = (workload_key(layer.geom), schedule)
        if key not in self.cache:
            try:
                self.cache[key] = self.inner.measure(layer, schedule)
            except (BackendError, ValueError) as err:  # refused by the back end: remembered, raised again
                self.cache[key] = err
        got = self.cache[key]
        if isinstance(got, Exception):
            raise got
        return got


def _trials_to(history: list[int | None], target: float) -> int | None:
    best = None
    for n, c in enumerate(history, 1):
        if c is not None:
            best = c if best is None else min(best, c)
        if best is not None and best <= target:
            return n
    return None


def _whole_model(proto: Any, cfg: Any, schedules: dict[str, Schedule]) -> tuple[int, int]:
    """Accelerator cycles of the whole model (timing model, every layer) with the default and the tuned
    schedules."""
    from weft.compiler.driver import compile_model
    from weft.compiler.errors import CalibrationWarning
    from weft.runtime.fsim_device import FsimDevice

    out = []
    for given in ({}, schedules):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            art = compile_model(proto, config=cfg, schedules=given)
        device = FsimDevice(cfg)
        device.load(art)
        out.append(sum(int(device.layer_cycles(layer) or 0) for layer in device.layers.values()))
    return out[0], out[1]


def bench_tune(config: str = "default", *, model: str = "resnet18", trials: int = 48, seeds: int = 3,
               layers: str | None = None, repeat: int | None = None, batch: int = 4) -> dict[str, Any]:
    """Per conv layer (distinct workloads): trials each tuner needs to reach 95% of the best found; and the
    whole model's accelerator cycles with default and with the best found schedules (timing model)."""
    from weft.compiler import models
    from weft.compiler.driver import compile_model
    from weft.compiler.errors import CalibrationWarning
    from weft.config import load_config

    cfg = load_config(config)
    if repeat is not None:
        seeds = repeat  # `weft bench --repeat N` sets the seeds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        art = compile_model(getattr(models, model)(), config=cfg, codegen=False)
    chosen = [x for x in layers_of(art.graph, cfg) if x.geom.kind == "conv"]
    if layers:
        chosen = [x for x in chosen if x.geom.name in layers.split(",")]
    distinct: dict[str, Layer] = {}
    for x in chosen:
        distinct.setdefault(workload_key(x.geom), x)
    measurer = _Cached(TimingMeasurer(cfg))
    best_of: dict[str, tuple[int, Schedule]] = {}
    rows, started = [], time.perf_counter()
    for layer in distinct.values():
        runs: dict[str, list[list[int | None]]] = {"xgb": [], "random": []}
        default_cycles = None
        for tuner in runs:
            for seed in range(seeds):
                r = tune_layer(layer, cfg, measurer, trials=trials, tuner=tuner, seed=seed, include_default=False,
                               batch=batch)
                key = workload_key(layer.geom)
                if r.best is not None and r.best_cycles is not None and \
                        (key not in best_of or r.best_cycles < best_of[key][0]):
                    best_of[key] = (r.best_cycles, r.best)
                runs[tuner].append(r.history)
                default_cycles, default_schedule = r.default_cycles, r.default
        best = min(c for hs in runs.values() for h in hs for c in h if c is not None)
        target = best / 0.95  # 95% of the best's speed
        row: dict[str, Any] = {"layer": layer.geom.name, "best_cycles": best, "default_cycles": default_cycles}
        for tuner, hs in runs.items():
            reach = [_trials_to(h, target) for h in hs]
            # A run that never reached the target counts as the whole budget plus one.
            row[f"{tuner}_trials_to_95"] = reach
            row[f"{tuner}_mean"] = sum(trials + 1 if t is None else t for t in reach) / len(reach)
        # What a compile with the log uses: the best found, or the default where the search did worse.
        key = workload_key(layer.geom)
        if default_cycles is not None and (key not in best_of or default_cycles <= best_of[key][0]):
            best_of[key] = (default_cycles, default_schedule)
        row["tuned_cycles"] = best_of[key][0]
        rows.append(row)
    xgb = sum(r["xgb_mean"] for r in rows)
    rnd = sum(r["random_mean"] for r in rows)
    layer_count = {k: sum(workload_key(x.geom) == k for x in chosen) for k in distinct}
    tuned = sum(r["tuned_cycles"] * n for r, n in zip(rows, layer_count.values(), strict=True))
    default = sum((r["default_cycles"] or 0) * n for r, n in zip(rows, layer_count.values(), strict=True))
    whole = _whole_model(getattr(models, model)(), cfg, {x.geom.name: best_of[workload_key(x.geom)][1]
                                                         for x in chosen if workload_key(x.geom) in best_of})
    return {"config": cfg.name, "model": model, "trials": trials, "seeds": seeds, "batch": batch, "layers": rows,
            "xgb_trials_to_95_total": xgb, "random_trials_to_95_total": rnd,
            "speedup_trials": rnd / xgb if xgb else None,
            "conv_cycles_default": default, "conv_cycles_tuned": tuned,
            "model_cycles_default": whole[0], "model_cycles_tuned": whole[1],
            "measurements": len(measurer.cache), "seconds": time.perf_counter() - started}
