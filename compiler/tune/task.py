"""What the tuning loop tunes: a :class:`TuningTask` is one workload on one target with its search space.

The loop (:func:`weft.compiler.tune.tuner.tune_task`) needs nothing else, so accelerator layers
(:class:`AccelTask`: the back end's schedules, cycles) and host kernels (CPU time) share one search, one
cost model and one log format.

A task names its workload (records of every layer of the same shape are shared), its target (the config
hash for the accelerator), the space (points with an index, knob-wise neighbours and feature rows), what
the measurer is given, and the untuned choice. ``features_of(workload, schedule_dict)`` turns a logged record of
*another* workload on the same target into a feature row, so a cost model can learn from earlier tasks
(transfer learning, as AutoTVM's ``tune_tasks(..., use_transfer_learning=True)``).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from weft.compiler.backend.codegen import BackendError
from weft.compiler.backend.schedule import LayerGeom, Schedule, ranked
from weft.compiler.tune.log import workload_key
from weft.compiler.tune.space import SearchSpace

if TYPE_CHECKING:
    import random

    from weft.compiler.tune.measure import Layer, Measurer
    from weft.config import AcceleratorConfig

__all__ = ["AccelTask", "Space", "TuningTask"]


class Space(Protocol):
    """The points a task may take, indexed; neighbours differ in one knob; features feed the cost model."""

    points: list[Any]

    def __len__(self) -> int: ...

    def __contains__(self, s: object) -> bool: ...

    def index(self, s: Any) -> int: ...

    def neighbour(self, s: Any, rng: random.Random) -> Any: ...

    def features(self, schedules: list[Any]) -> np.ndarray: ...


class TuningTask(Protocol):
    name: str  # a layer name, for records and progress bars
    workload: str  # the log key shared by every layer of the same shape
    target: str  # the log's "config" field: the accelerator config hash, or a host target key
    unit: str  # what the measurements count: "cycles", "ns"
    subject: Any  # what `measurer.measure(subject, schedule)` is given

    @property
    def space(self) -> Space: ...

    def parse(self, data: Mapping[str, Any]) -> Hashable:
        """A logged schedule dict -> a point (ValueError when it is not one)."""

    def to_dict(self, schedule: Any) -> dict[str, Any]: ...

    def defaults(self) -> Sequence[Any]:
        """The untuned choice first, then fallbacks when it does not run."""

    def features_of(self, workload: str, schedule: Mapping[str, Any]) -> np.ndarray | None:
        """Feature row of another workload's logged schedule on this target (None: not comparable)."""


class AccelTask:
    """An accelerator layer: the back end's legal schedules, measured in cycles."""

    unit = "cycles"

    def __init__(self, layer: Layer, config: AcceleratorConfig) -> None:
        self.subject, self.config = layer, config
        self.name = layer.geom.name
        self.workload = workload_key(layer.geom)
        self.target = config.hash

    @cached_property
    def space(self) -> SearchSpace:
        return SearchSpace(self.subject.geom, self.config)

    def defaults(self) -> list[Schedule]:
        return ranked(self.subject.geom, self.config)[:32]

    # a logged schedule dict <-> a point: the schedule type's own (de)serialization
    parse = staticmethod(Schedule.from_dict)
    to_dict = staticmethod(Schedule.to_dict)

    def features_of(self, workload: str, schedule: Mapping[str, Any]) -> np.ndarray | None:
        try:
            fields = json.loads(workload)
            fields["pads"] = tuple(fields["pads"])
            space = _space_of(LayerGeom(name="", **fields), self.config)
            return space.features([Schedule.from_dict(schedule)])[0]
        except (TypeError, ValueError, KeyError):  # another kind of workload (a host kernel, an old format)
            return None


@lru_cache(maxsize=64)
def _space_of(geom: LayerGeom, config: AcceleratorConfig) -> SearchSpace:
    return SearchSpace(geom, config)


def default_of(task: TuningTask, measurer: Measurer) -> tuple[Any, int | None]:
    """The untuned choice that runs, and what it measures (None when none of the fallbacks run)."""
    candidates = list(task.defaults())
    for s in candidates:
        try:
            return s, measurer.measure(task.subject, s)
        except (BackendError, ValueError):
            continue
    return candidates[0], None
