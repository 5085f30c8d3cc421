"""`weft bench tune`: trials to reach 95% of the best-found cycles, XGBoost vs random search, over seeds,
on a model's conv layers; and tuned vs default cycles of the tuned layers and of the whole model (timing
model).

Three searches per layer and seed, on the same budget, none given the back end's default:

* ``random``: uniform samples without repetition (the baseline);
* ``xgb``: the model-based tuner starting cold (its first batch is random);
* ``xgb_transfer``: the same tuner whose cost model also learns from the layers tuned before this one in
  the same run (model order, this seed's ``xgb_transfer`` measurements only; the first layer starts cold),
  which is how ``weft tune`` runs over a model (AutoTVM's transfer learning).

Each distinct workload is measured through a cache shared by every run (measurements are deterministic),
and batches are measured on a process pool, so several seeds cost little more than one. The best found
is the best any run of that layer measured.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from weft.compiler.backend.schedule import Schedule
from weft.compiler.tune.log import TuningLog, task_record, workload_key
from weft.compiler.tune.measure import Layer, TimingMeasurer, layers_of
from weft.compiler.tune.parallel import PoolMeasurer
from weft.compiler.tune.tuner import Transfer, tune_layer
from weft.config import load_config
from weft.core.errors import CalibrationWarning
from weft.errors import UsageError
from weft.progress import Progress
from weft.runtime.fsim_device import FsimDevice

__all__ = ["SEARCHES", "bench_tune"]

SEARCHES = ("random", "xgb", "xgb_transfer")


class _Cached:
    """A measurer that remembers (failures included) and measures what it lacks as one batch; with a log,
    it starts from the log's measurements (same config and measurer) and appends its own, so an
    interrupted benchmark resumes."""

    def __init__(self, inner: PoolMeasurer, config_hash: str, log: TuningLog | None = None) -> None:
        self.inner, self.name, self.config_hash, self.log = inner, inner.name, config_hash, log
        self.cache: dict[tuple[str, Schedule], int | Exception] = {}
        for rec in log.records if log is not None else ():
            if rec["config"] == config_hash and rec.get("measurer") == self.name:
                got = rec["cycles"] if rec["cycles"] is not None else ValueError(rec.get("error") or "failed")
                self.cache[rec["workload"], Schedule.from_dict(rec["schedule"])] = got
        self.reused = len(self.cache)

    def _store(self, pairs: list[tuple[Layer, Schedule]], outcomes: list[int | Exception]) -> None:
        for (layer, s), got in zip(pairs, outcomes, strict=True):
            self.cache[workload_key(layer.geom), s] = got
            if self.log is not None:
                self.log.add(task_record(workload_key(layer.geom), self.config_hash, layer.geom.name, s.to_dict(),
                                         None if isinstance(got, Exception) else got, self.name,
                                         str(got) if isinstance(got, Exception) else None))

    def prefetch(self, pairs: list[tuple[Layer, Schedule]]) -> None:
        """Measure every pair not cached yet as one parallel map (the pool stays busy across layers)."""
        todo = list({(workload_key(x.geom), s): (x, s) for x, s in pairs
                     if (workload_key(x.geom), s) not in self.cache}.values())
        step = 16 * self.inner.jobs  # stored (and logged) as they come, so an interrupted run keeps them
        for k in range(0, len(todo), step):
            self._store(todo[k:k + step], self.inner.measure_pairs(todo[k:k + step]))

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        got = self.measure_many(layer, [schedule])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def measure_many(self, layer: Layer, schedules: list[Schedule]) -> list[int | Exception]:
        key = workload_key(layer.geom)
        todo = list(dict.fromkeys(s for s in schedules if (key, s) not in self.cache))
        if todo:
            self._store([(layer, s) for s in todo], self.inner.measure_many(layer, todo))
        return [self.cache[key, s] for s in schedules]


class _Recorder:
    """A measurer that measures nothing and remembers what it was asked: random search's choices do not
    depend on the cycles it sees, so running it against this lists its schedules before any is measured."""

    name = "recorder"

    def __init__(self) -> None:
        self.asked: list[tuple[Layer, Schedule]] = []

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        self.asked.append((layer, schedule))
        return 1


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
    from weft.compiler.backend.codegen import generate
    from weft.compiler.driver import compile_model  # optional dependency: onnx

    out = []
    for tuned in ({}, schedules):  # (as a compile with a tuning log uses them)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            art = compile_model(proto, config=cfg, codegen=False)
        generate(art, tuned=tuned)
        device = FsimDevice(cfg)
        device.load(art)
        out.append(sum(int(device.layer_cycles(layer) or 0) for layer in device.layers.values()))
    return out[0], out[1]


def bench_tune(config: str = "default", *, model: str = "resnet18", trials: int = 48, seeds: int = 3,
               layers: str | None = None, repeat: int | None = None, batch: int = 4,
               jobs: int | None = None, threads: int | None = None, log: str | None = None) -> dict[str, Any]:
    """Per conv layer (distinct workloads, model order): trials each search needs to reach 95% of the best
    found; and the whole model's accelerator cycles with default and with the best found schedules.
    Measurements run on `jobs` processes (`weft bench tune --threads N`; default: every core); `log` (a
    JSON-lines tuning log) keeps them, so a second run (more seeds, more layers) measures only what is new."""
    from weft.compiler import models  # optional dependency: onnx
    from weft.compiler.driver import compile_model

    cfg = load_config(config)
    if repeat is not None:
        seeds = repeat  # `weft bench --repeat N` sets the seeds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        art = compile_model(getattr(models, model)(), config=cfg, codegen=False)
    chosen = [x for x in layers_of(art.graph, cfg) if x.geom.kind == "conv"]
    if layers:
        wanted = layers.split(",")
        unknown = sorted(set(wanted) - {x.geom.name for x in chosen})
        if unknown:
            raise UsageError(f"'{unknown[0]}' is not a conv layer of {model} on the accelerator")
        chosen = [x for x in chosen if x.geom.name in wanted]
    distinct: dict[str, Layer] = {}
    for x in chosen:
        distinct.setdefault(workload_key(x.geom), x)
    jobs = jobs if jobs is not None else threads if threads is not None else (os.cpu_count() or 1)
    best_of: dict[str, tuple[int, Schedule]] = {}
    transfers = [Transfer() for _ in range(seeds)]
    rows, started = [], time.perf_counter()
    with PoolMeasurer(lambda: TimingMeasurer(cfg), jobs) as pool, \
            Progress(len(distinct) * seeds * len(SEARCHES), "bench tune") as bar:
        measurer = _Cached(pool, cfg.hash, TuningLog(log) if log else None)
        recorder = _Recorder()
        for layer in distinct.values():
            for seed in range(seeds):
                tune_layer(layer, cfg, recorder, trials=trials, tuner="random", seed=seed, include_default=False,
                           batch=batch)
        measurer.prefetch(recorder.asked)
        for layer in distinct.values():
            key = workload_key(layer.geom)
            runs: dict[str, list[list[int | None]]] = {name: [] for name in SEARCHES}
            default_cycles, default_schedule = None, None
            for seed in range(seeds):
                for search in SEARCHES:
                    r = tune_layer(layer, cfg, measurer, trials=trials, tuner="random" if search == "random" else "xgb",
                                   seed=seed, include_default=False, batch=batch,
                                   transfer=transfers[seed] if search == "xgb_transfer" else None)
                    if search == "xgb_transfer" and r.features is not None and r.costs is not None:
                        transfers[seed].add(r.features, r.costs)
                    if r.best is not None and r.best_cycles is not None and \
                            (key not in best_of or r.best_cycles < best_of[key][0]):
                        best_of[key] = (r.best_cycles, r.best)
                    runs[search].append(r.history)
                    default_cycles, default_schedule = r.default_cycles, r.default
                    bar.advance()
            best = min(c for hs in runs.values() for h in hs for c in h if c is not None)
            target = best / 0.95  # 95% of the best's speed
            row: dict[str, Any] = {"layer": layer.geom.name, "best_cycles": best, "default_cycles": default_cycles}
            for search, hs in runs.items():
                reach = [_trials_to(h, target) for h in hs]
                # A run that never reached the target counts as the whole budget plus one.
                row[f"{search}_trials_to_95"] = reach
                row[f"{search}_mean"] = sum(trials + 1 if t is None else t for t in reach) / len(reach)
            # What a compile with the log uses: the best found, or the default where the search did worse.
            if default_cycles is not None and (key not in best_of or default_cycles <= best_of[key][0]):
                best_of[key] = (default_cycles, default_schedule)
            row["tuned_cycles"] = best_of[key][0]
            rows.append(row)
    totals = {search: sum(r[f"{search}_mean"] for r in rows) for search in SEARCHES}
    layer_count = {k: sum(workload_key(x.geom) == k for x in chosen) for k in distinct}
    tuned = sum(r["tuned_cycles"] * n for r, n in zip(rows, layer_count.values(), strict=True))
    default = sum((r["default_cycles"] or 0) * n for r, n in zip(rows, layer_count.values(), strict=True))
    whole = _whole_model(getattr(models, model)(), cfg, {x.geom.name: best_of[workload_key(x.geom)][1]
                                                         for x in chosen if workload_key(x.geom) in best_of})
    return {"config": cfg.name, "model": model, "trials": trials, "seeds": seeds, "batch": batch, "jobs": jobs,
            "layers": rows,
            **{f"{search}_trials_to_95_total": totals[search] for search in SEARCHES},
            # Fewer trials than random to reach 95% of the best: cold, and with transfer between layers.
            "speedup_trials": totals["random"] / totals["xgb"] if totals["xgb"] else None,
            "speedup_trials_transfer": totals["random"] / totals["xgb_transfer"] if totals["xgb_transfer"] else None,
            "conv_cycles_default": default, "conv_cycles_tuned": tuned,
            "model_cycles_default": whole[0], "model_cycles_tuned": whole[1],
            "measurements": len(measurer.cache) - measurer.reused, "measurements_reused": measurer.reused,
            "seconds": time.perf_counter() - started}
