"""Host convolutions tuned against real CPU time: the tuning task, its space and measurer, and the lookup
that compiles a float graph with the best logged schedules.

The float CPU path (``weft.compile(..., target="cpu")`` run on the "cpu" device) turns every convolution
into one register-blocked micro-kernel (:func:`weft.compiler.llvm.nn.conv_kernel`) whose tiles a
heuristic picks. Here a :class:`HostConvTask` searches the :class:`~weft.compiler.llvm.nn.ConvSchedule`
points instead: every legal (r, ocb) tile (r divides the output width, ocb the output channel blocks,
r*ocb + ocb vector registers within the register file), every distinct order of the reduction loops, and
which loops run outermost (and so which are split over threads). :class:`CpuTimeMeasurer` JIT-compiles
each point and times it on this machine in nanoseconds.

Records go to the same JSON-lines log as accelerator layers (unit "ns"), keyed by the conv workload
(:attr:`ConvWorkload.key`: the spec and epilogue, no node name) and a host target key
(:func:`host_key`: LLVM triple, CPU name and thread count), so timings of different machines or thread
counts never mix. :func:`tuned_schedules` reads a log back for :func:`weft.compiler.llvm.graph.plan_graph`
(``tuning_log=``), which the "cpu" device's ``tuning_log=PATH`` option reaches.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import statistics
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.compiler.llvm.nn import (
    OUTER_ORDERS,
    REDUCE_LOOPS,
    ConvSchedule,
    ConvWorkload,
    conv_tiles,
    reduce_orders,
    tile_score,
)
from weft.compiler.llvm.target import Target, host_target
from weft.compiler.tune.log import LogError, TuningLog
from weft.compiler.tune.space import IndexedPoints
from weft.compiler.tune.tuner import tune_tasks
from weft.errors import UsageError

if TYPE_CHECKING:
    import random

    from weft.compiler.tune.tuner import LayerResult
    from weft.core.ir import Graph

__all__ = ["ConvSpace", "CpuTimeMeasurer", "HostConv", "HostConvTask", "conv_features", "host_key", "host_tasks",
           "tune_host", "tuned_schedules"]

#: largest relative difference a schedule's output may show against the default schedule's (float
#: reassociation of a different reduction order, never a wrong kernel)
CHECK_RTOL = 1e-4


def host_key(threads: int, target: Target | None = None) -> str:
    """The log's target field for host kernels: what a CPU time depends on besides the kernel."""
    t = target or host_target()
    return f"cpu:{t.triple}:{t.cpu}:threads={int(threads)}"


@dataclass(frozen=True)
class HostConv:
    """What the measurer is given: a conv workload, the layer it came from and the threads it runs on."""

    name: str
    workload: ConvWorkload
    threads: int


def _outer_loops(workload: ConvWorkload, s: ConvSchedule) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parallel (fused) and the serial loops outside the micro-kernel that run more than once."""
    spec = workload.spec
    oh, ow = spec.out_hw
    extent = {"n": spec.n, "co": spec.cout // spec.bo // s.ocb, "oh": oh, "ow": ow // s.r}
    par, ser = {"co": (("n", "co", "oh"), ("ow",)), "oh": (("n", "oh", "co"), ("ow",)),
                "ow": (("n", "oh"), ("ow", "co"))}[s.outer]
    return tuple(a for a in par if extent[a] > 1), tuple(a for a in ser if extent[a] > 1)


def conv_features(workload: ConvWorkload, s: ConvSchedule, target: Target) -> list[float]:
    """A schedule of a workload as numbers a cost model ranks by: tile sizes, registers, work and bytes
    per tile, parallel iterations, loop orders, and the workload's own shape (so that rankings transfer
    between workloads). Sizes are log2-scaled."""
    spec = workload.spec
    oh, ow = spec.out_hw
    blocks = spec.cout // spec.bo
    red = spec.cin * spec.kh * spec.kw
    extents = {"rco": spec.cin // spec.bi, "rkh": spec.kh, "rkw": spec.kw}
    in_bytes = 4 * spec.cin * spec.kh * ((s.r - 1) * spec.stride[1] + spec.kw)
    w_bytes = 4 * s.ocb * spec.bo * red
    flops = 2 * s.r * s.ocb * spec.bo * red
    par, ser = _outer_loops(workload, s)
    par_iters = spec.n * (blocks // s.ocb if "co" in par else 1) * oh
    lg = math.log2
    return [
        lg(s.r), lg(s.ocb), lg(s.registers()), s.registers() / target.vector_registers, lg(flops), lg(in_bytes),
        lg(w_bytes), lg(flops / (in_bytes + w_bytes)), lg(spec.n * blocks // s.ocb * oh * ow // s.r), lg(par_iters),
        tile_score(s.r, s.ocb),  # the heuristic's own preference
        *[float(s.order.index(a)) if extents[a] > 1 else -1.0 for a in REDUCE_LOOPS],
        lg(extents[s.order[-1]]), lg(extents[s.order[0]]),
        *[float(s.outer == o) for o in OUTER_ORDERS], float(len(ser)),
        lg(spec.cin), lg(spec.cout), lg(oh * ow), lg(spec.kh * spec.kw), float(spec.stride[1]), lg(spec.bi),
    ]


class ConvSpace(IndexedPoints[ConvSchedule]):
    """The distinct legal schedules of one conv workload (see the module docstring), indexed."""

    KNOBS = ("r", "ocb", "order", "outer")

    def __init__(self, workload: ConvWorkload, target: Target) -> None:
        self.workload, self.target = workload, target
        spec = workload.spec
        _, ow = spec.out_hw
        blocks = spec.cout // spec.bo
        tiles = [(r, ocb) for ocb in range(1, blocks + 1) if blocks % ocb == 0
                 for r in range(1, ow + 1) if ow % r == 0 and r * ocb + ocb <= target.vector_registers]
        seen: set[tuple[Any, ...]] = set()
        self.points: list[ConvSchedule] = []
        for r, ocb in tiles:
            for order in reduce_orders(spec):
                for outer in OUTER_ORDERS:
                    s = ConvSchedule(r, ocb, order, outer)
                    sig = (r, ocb, order, _outer_loops(workload, s))  # outer orders that give the same loops
                    if sig not in seen:
                        seen.add(sig)
                        self.points.append(s)
        self._index = {s: i for i, s in enumerate(self.points)}
        self._near: dict[int, list[int]] = {}

    def neighbour(self, s: ConvSchedule, rng: random.Random) -> ConvSchedule:
        """A point that differs from `s` in exactly one knob (`s` itself when none does)."""
        i = self.index(s)
        if i not in self._near:
            self._near[i] = [j for j, p in enumerate(self.points)
                             if sum(getattr(p, k) != getattr(s, k) for k in self.KNOBS) == 1]
        near = self._near[i]
        return self.points[rng.choice(near)] if near else s

    def features(self, schedules: list[ConvSchedule]) -> np.ndarray:
        return np.array([conv_features(self.workload, s, self.target) for s in schedules], np.float64)


class HostConvTask:
    """One convolution of a float graph on this machine's CPU, on `threads` threads, measured in ns."""

    unit = "ns"

    def __init__(self, name: str, workload: ConvWorkload, threads: int, target: Target | None = None) -> None:
        if threads < 1:
            raise UsageError(f"threads must be at least 1, got {threads}")
        self.machine = target or host_target()
        self.subject = HostConv(name, workload, int(threads))
        self.name = name
        self.workload = workload.key
        self.target = host_key(threads, self.machine)

    @cached_property
    def space(self) -> ConvSpace:
        return ConvSpace(self.subject.workload, self.machine)

    # a logged schedule dict <-> a point: the schedule type's own (de)serialization
    parse = staticmethod(ConvSchedule.from_dict)
    to_dict = staticmethod(ConvSchedule.to_dict)

    def defaults(self) -> list[ConvSchedule]:
        spec = self.subject.workload.spec
        return [ConvSchedule(*conv_tiles(spec, self.machine)), ConvSchedule(1, 1)]

    def features_of(self, workload: str, schedule: Mapping[str, Any]) -> np.ndarray | None:
        try:
            return np.asarray(conv_features(ConvWorkload.from_key(workload), ConvSchedule.from_dict(schedule),
                                            self.machine), np.float64)
        except ValueError:  # an accelerator layer's record, or another kind of host kernel
            return None


#: how the samples of one measurement become one figure
STATISTICS = {"min": min, "median": statistics.median}


class CpuTimeMeasurer:
    """Compile a conv schedule (through the JIT's cache), check it computes what the heuristic's schedule
    computes, and time it: nanoseconds per call over `repeat` samples, each sample as many back-to-back
    calls as take `min_sample_s` (after `warmup` calls).

    `statistic` "min" (the default) or "median" of the samples. Other processes can only slow a sample
    down, and on a shared machine they do so a lot: on 2 cores under a load of 6, eight measurements of
    one kernel gave medians from 43 to 128 us but minimums within 0.1% of each other, and a ranking needs
    the latter.

    A core taken by another process for seconds slows every sample alike, and worse, unevenly across
    schedules (a parallel split that balances on two free cores need not on one). So a probe (the FMA
    peak kernel, :func:`~weft.compiler.llvm.peak.peak_kernel`: as much work per thread on any number of
    threads) runs on the same threads before and after each measurement: when its median call takes more
    than `quiet` times the fastest call of the one-thread probe, the threads did not each have a core,
    and the measurement is taken again after a back-off, up to `attempts` times in all, keeping the
    fastest (``quiet=0`` turns the probe off). :attr:`busy_retries` counts the retries, :attr:`busy` the
    measurements that never saw a quiet machine.

    In a model, a convolution's input was just written by the layer before it, but its weights come from
    memory: a network's weights outgrow the last-level cache (ResNet-18: 46 MB), so each run evicts them
    before the next. Back-to-back calls on one weight buffer would time them cache-hot instead, so calls
    rotate over copies of the weights that together take at least `cold_bytes` (0: one buffer, hot), as
    AutoTVM's ``enable_cpu_cache_flush`` does."""

    name = "cpu"

    def __init__(self, *, repeat: int = 15, warmup: int = 2, min_sample_s: float = 2e-3, statistic: str = "min",
                 quiet: float = 1.25, attempts: int = 4, cold_bytes: int = 64 << 20,
                 cache_dir: str | Path | None = None) -> None:
        if repeat < 1 or attempts < 1:
            raise UsageError(f"repeat and attempts must be at least 1, got {repeat} and {attempts}")
        if statistic not in STATISTICS:
            raise UsageError(f"statistic must be one of {', '.join(STATISTICS)}, got '{statistic}'")
        if quiet and quiet < 1:
            raise UsageError(f"quiet must be 0 (no probe) or at least 1, got {quiet}")
        self.repeat, self.warmup, self.min_sample_s, self.cache_dir = repeat, warmup, min_sample_s, cache_dir
        self.statistic, self.quiet, self.attempts, self.cold_bytes = statistic, quiet, attempts, cold_bytes
        self.busy_retries = self.busy = 0
        self._probes: dict[int, Any] = {}  # threads -> a probe call
        self._fastest = math.inf  # the one-thread probe's fastest call
        #: the workload whose buffers are allocated (one at a time: cold weights take `cold_bytes`), its
        #: arrays and one pointer array per copy of the weights
        self._buffers: tuple[str, list[np.ndarray], list[ctypes.Array]] | None = None
        self._expected: dict[str, np.ndarray] = {}

    def _compile(self, subject: HostConv, schedule: ConvSchedule) -> Any:
        from weft.compiler.llvm.jit import build  # optional dependency: llvmlite

        target = host_target()
        try:
            return build(subject.workload.kernel(target, schedule), target, cache_dir=self.cache_dir)
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"conv '{subject.name}': schedule {schedule.to_dict()} does not compile: {err}") from None

    def _arrays(self, subject: HostConv, fn: Any) -> tuple[list[np.ndarray], list[ctypes.Array]]:
        """Random inputs, a zeroed output, and pointer arrays over the copies of the weights."""
        key = subject.workload.key
        if self._buffers is None or self._buffers[0] != key:
            self._buffers = None  # free the last workload's copies first
            rng = np.random.default_rng(0)
            n_in = fn.n_inputs - 1  # one output: y
            arrays = []
            for k, p in enumerate(fn.params):
                a = np.zeros(p.shape, np.float32)
                if k < n_in:
                    a[...] = rng.standard_normal(p.shape) * (0.1 if p.name == "w" else 1.0)
                arrays.append(a)
            w = next(k for k, p in enumerate(fn.params) if p.name == "w")
            copies = [arrays[w]] + [arrays[w].copy() for _ in range(math.ceil(self.cold_bytes / arrays[w].nbytes))]
            ptr_sets = []
            for c in copies if self.cold_bytes else copies[:1]:
                ptr_sets.append((ctypes.c_void_p * len(arrays))(
                    *[(c if k == w else a).ctypes.data for k, a in enumerate(arrays)]))
            self._buffers = (key, arrays + copies[1:], ptr_sets)  # the copies live as long as their pointers
        return self._buffers[1][:len(fn.params)], self._buffers[2]

    def measure(self, subject: HostConv, schedule: ConvSchedule) -> int:
        fn = self._compile(subject, schedule)
        arrays, ptr_sets = self._arrays(subject, fn)
        out = arrays[fn.n_inputs - 1]
        ptrs = ptr_sets[0]
        key = subject.workload.key
        if key not in self._expected:
            ref = self._compile(subject, ConvSchedule(*conv_tiles(subject.workload.spec, host_target())))
            ref.raw(ptrs, subject.threads)
            self._expected[key] = out.copy()
        out[...] = 0
        fn.raw(ptrs, subject.threads)
        want = self._expected[key]
        err = float(np.abs(out - want).max() / max(float(np.abs(want).max()), 1e-30))
        if not err <= CHECK_RTOL:
            raise ValueError(f"conv '{subject.name}': schedule {schedule.to_dict()} computes other values than the "
                             f"default schedule (relative difference {err:.3g})")
        best = None
        for attempt in range(self.attempts):
            busy = self.is_busy(subject.threads)
            ns = self._time(fn, ptr_sets, subject.threads)
            busy = self.is_busy(subject.threads) or busy
            best = ns if best is None else min(best, ns)
            if not busy:
                return best
            if attempt == self.attempts - 1:
                self.busy += 1
                return best
            self.busy_retries += 1
            time.sleep(0.05 * 2 ** attempt)
        raise AssertionError("unreachable")

    def _time(self, fn: Any, ptr_sets: list[ctypes.Array], threads: int) -> int:
        turn = itertools.cycle(ptr_sets)  # each call on the copy of the weights used longest ago
        for _ in range(self.warmup):
            fn.raw(next(turn), threads)
        start = time.perf_counter()
        fn.raw(next(turn), threads)
        once = time.perf_counter() - start
        calls = max(1, min(1000, math.ceil(self.min_sample_s / max(once, 1e-7))))
        samples = []
        for _ in range(self.repeat):
            sets = [next(turn) for _ in range(calls)]
            start = time.perf_counter()
            for ptrs in sets:
                fn.raw(ptrs, threads)
            samples.append((time.perf_counter() - start) / calls)
        return max(1, round(STATISTICS[self.statistic](samples) * 1e9))

    def is_busy(self, threads: int) -> bool:
        """Whether other processes slow the probe on `threads` threads down now (its median call against
        the one-thread probe's fastest); always False with ``quiet=0``."""
        if not self.quiet:
            return False
        from weft.compiler.llvm.peak import call_times, peak_kernel  # optional dependency: llvmlite

        for t in {1, threads}:
            if t not in self._probes:
                self._probes[t] = peak_kernel(t)[0]
        if self._fastest == math.inf:
            self._fastest = min(call_times(self._probes[1], 40))
        calls = call_times(self._probes[threads], 5, warmup=0)
        if threads == 1:
            self._fastest = min(self._fastest, *calls)
        return statistics.median(calls) > self.quiet * self._fastest


def host_tasks(graph: Graph, threads: int, target: Target | None = None) -> list[HostConvTask]:
    """The convolutions of a float graph (as the "cpu" device plans it), in graph order, one task each."""
    from weft.compiler.llvm.graph import plan_steps  # optional dependency: llvmlite

    target = target or host_target()
    plan = plan_steps(graph, target)
    return [HostConvTask(node, workload, threads, target) for node, (workload, _, _) in plan.convs.items()]


def tuned_schedules(log: TuningLog | str | Path, threads: int, target: Target | None = None
                    ) -> dict[str, ConvSchedule]:
    """Conv workload key -> its fastest logged schedule on this host target with `threads` threads.

    Records of other targets (machines, thread counts, the accelerator), failed measurements and
    schedules that are not legal for their workload here are ignored; a log with host records, none of
    them for this target, draws a warning that names the targets it has."""
    if not isinstance(log, TuningLog):
        path = Path(log)
        if not path.is_file():
            raise LogError(f"tuning log '{path}' does not exist")
        log = TuningLog(path)
    target = target or host_target()
    key = host_key(threads, target)
    best: dict[str, tuple[int, str, ConvSchedule]] = {}
    hosts: set[str] = set()
    for rec in log.records:
        if str(rec["config"]).startswith("cpu:"):
            hosts.add(rec["config"])
        if rec["config"] != key or rec["cycles"] is None:
            continue
        try:
            workload = ConvWorkload.from_key(rec["workload"])
            s = ConvSchedule.from_dict(rec["schedule"])
        except ValueError:
            continue
        if s.illegal_for(workload.spec, target) is not None:
            continue
        cand = (int(rec["cycles"]), str(s.to_dict()), s)
        if rec["workload"] not in best or cand[:2] < best[rec["workload"]][:2]:
            best[rec["workload"]] = cand
    if hosts and key not in hosts:
        where = f" '{log.path}'" if log.path is not None else ""
        warnings.warn(f"tuning log{where} has no records for host target {key} (it has: {', '.join(sorted(hosts))}); "
                      "convolutions keep the heuristic's tiles", stacklevel=2)
    return {wl: s for wl, (_, _, s) in best.items()}


def tune_host(graph: Graph, threads: int, *, trials: int, log: TuningLog | None = None, tuner: str = "xgb",
              seed: int = 0, batch: int = 4, layers: list[str] | None = None, show_progress: bool = True,
              measurer: CpuTimeMeasurer | None = None, transfer: bool = True) -> list[LayerResult]:
    """Tune the convolutions of a float graph on this CPU with `threads` threads (each distinct workload
    once; `layers` keeps only those conv nodes; `transfer` as in :func:`tune_tasks`). Measurements are
    taken one at a time, in this process: parallel measurements would time each other."""
    tasks = host_tasks(graph, threads)
    if layers is not None:
        unknown = sorted(set(layers) - {t.name for t in tasks})
        if unknown:
            raise UsageError(f"'{unknown[0]}' is not a convolution of the model on the host "
                             f"(convolutions: {', '.join(t.name for t in tasks)})")
        tasks = [t for t in tasks if t.name in layers]
    return tune_tasks(tasks, measurer or CpuTimeMeasurer(), trials=trials, tuner=tuner,  # type: ignore[arg-type]
                      log=log, seed=seed, batch=batch, show_progress=show_progress, transfer=transfer)
