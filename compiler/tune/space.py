"""The search space of one accelerator layer: every schedule the back end's own fit check accepts.

Points are :class:`~weft.compiler.backend.schedule.Schedule` values, enumerated by
:func:`weft.compiler.backend.schedule.space` (valid by construction: tiles divide the layer, buffers fit).
A neighbour changes one knob to another value the space holds, so an explorer never leaves it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from weft.compiler.backend.schedule import ORDERS, LayerGeom, Schedule, cost, space, usage
from weft.errors import UsageError

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["KNOBS", "IndexedPoints", "SearchSpace", "features_of_schedule"]

#: The knobs a schedule turns, in feature order.
KNOBS = ("tile_n", "tile_h", "tile_w", "tile_oc", "tile_ic", "tile_kh", "order", "vthreads")

P = TypeVar("P")


class IndexedPoints(Generic[P]):
    """The lookups every space shares: its points in a list, their positions in ``_index``."""

    points: list[P]
    _index: dict[P, int]

    def __len__(self) -> int:
        return len(self.points)

    def __contains__(self, s: object) -> bool:
        return s in self._index

    def index(self, s: P) -> int:
        return self._index[s]


@dataclass
class SearchSpace(IndexedPoints[Schedule]):
    """The legal schedules of layer `geom` on `config` with an index, knob-wise neighbours and features."""

    geom: LayerGeom
    config: AcceleratorConfig
    points: list[Schedule] = field(init=False)
    _index: dict[Schedule, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.points = list(space(self.geom, self.config))
        if not self.points:
            raise UsageError(f"layer '{self.geom.name}': no schedule fits the buffers of config '{self.config.name}'")
        self._index = {s: i for i, s in enumerate(self.points)}

    def sample(self, rng: random.Random) -> Schedule:
        return self.points[rng.randrange(len(self.points))]

    def neighbour(self, s: Schedule, rng: random.Random) -> Schedule:
        """A schedule of the space that differs from `s` in one knob (or `s` when it has none)."""
        knobs = list(KNOBS)
        rng.shuffle(knobs)
        for knob in knobs:
            options = [p for p in self._knob_moves(s, knob)]
            if options:
                return rng.choice(options)
        return s

    def _knob_moves(self, s: Schedule, knob: str) -> list[Schedule]:
        here = asdict(s)
        values: list[object]
        if knob == "order":
            values = list(ORDERS)
        elif knob == "vthreads":
            values = [1, 2]
        else:
            values = sorted({getattr(p, knob) for p in self.points}, key=lambda v: (v is None, v or 0))
        out = []
        for v in values:
            if v == here[knob]:
                continue
            cand = Schedule(**{**here, knob: v})
            if cand in self._index:
                out.append(cand)
        return out

    def features(self, schedules: list[Schedule]) -> np.ndarray:
        """One row per schedule: its knobs and what its loop nest does (tiles, stages, executions, DRAM
        bytes and instructions per unit, SRAM rows, the back end's analytic cycle estimate), log-scaled so
        that trees split on ratios; then the same loop-nest figures relative to the least any schedule of
        the space reaches (log ratios), which mean the same on every layer, so what a cost model learns on
        one layer transfers to the next."""
        raw = np.array([features_of_schedule(self.geom, s, self.config) for s in schedules], dtype=np.float64)
        raw = raw.reshape(len(schedules), _RAW_COLUMNS)
        return np.hstack([raw, raw[:, len(KNOBS):] - self.floor])

    @cached_property
    def floor(self) -> np.ndarray:
        """Per loop-nest feature, the least value over the whole space (its log)."""
        every = np.array([features_of_schedule(self.geom, s, self.config) for s in self.points], dtype=np.float64)
        return every[:, len(KNOBS):].min(axis=0)


_NEST_COLUMNS = 18
_RAW_COLUMNS = len(KNOBS) + _NEST_COLUMNS


def features_of_schedule(g: LayerGeom, s: Schedule, config: AcceleratorConfig) -> list[float]:
    """The cost model's feature row of schedule `s` of layer `g` (see :meth:`SearchSpace.features`)."""
    u = usage(g, s, config)
    kh = g.kh if s.tile_kh is None else s.tile_kh
    knobs = [s.tile_n, s.tile_h, s.tile_w, s.tile_oc, s.tile_ic, kh, ORDERS.index(s.order), s.vthreads]
    nest = [u.tasks, u.stages, u.gemm_execs, u.alu_execs, u.load_bytes, u.load_insns, u.acc_bytes,
            u.compute_insns, u.store_bytes, u.store_insns, u.inp, u.wgt, u.acc, u.uops,
            s.tile_n * s.tile_h * s.tile_w, u.gemm_execs / max(u.stages, 1), u.load_bytes / max(u.stages, 1),
            # The back end's analytic estimate: a strong prior the trees can correct from few measurements.
            cost(g, s, config)]
    assert len(nest) == _NEST_COLUMNS
    return [float(k) for k in knobs] + [float(np.log2(1.0 + x)) for x in nest]
