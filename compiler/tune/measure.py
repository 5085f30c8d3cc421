"""Measurers: what one schedule of one layer costs, in cycles.

A measurer implements :class:`Measurer` (``name`` and ``measure(layer, schedule) -> cycles``); the tuner
never needs more, so a board measurer (run the layer's program, read the cycle counter) drops in.

* :class:`TimingMeasurer` lowers the layer with the back end (its own checks reject a schedule that does
  not lower: exact micro-op counts, hazards, tokens) and times the program with the timing model
  (:mod:`weft.sim.timing`): fast, and the figures the compiler's other tools report.
* :class:`RtlMeasurer` runs the same program on the RTL through the cosimulation (:mod:`weft.sim.cosim`,
  the same DRAM timing): the RTL's cycle counter, exact but slow (small layers). The board measurer
  (:mod:`weft.tools.board_measurer`) implements the same protocol.

A layer is lowered on a DRAM plan of its own: activations where the whole model puts them, but its
constants (weights, micro-ops, instructions) right after them instead of after every earlier layer's, so
a DMA that crosses a 4 KiB boundary in one image but not the other can make the cycles differ from the
whole model's by a few hundred cycles (well under 1%); the ranking of schedules is what tuning needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from weft.compiler.backend import codegen, memory
from weft.compiler.backend.schedule import LayerGeom, Schedule
from weft.compiler.backend.te import tensorize
from weft.isa.encoding import decode_insns
from weft.sim.cosim import Job, run_jobs
from weft.sim.timing import TimingModel

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.ir import Graph, Node

__all__ = ["Layer", "LoweredLayer", "Measurer", "RtlMeasurer", "TimingMeasurer", "layers_of", "lower"]


@dataclass(frozen=True)
class Layer:
    """An accelerator node of a packed graph with its geometry."""

    node: Node
    graph: Graph
    geom: LayerGeom
    nonnegative: bool = False  # its input is proven >= 0 (as the back end sees it in the whole graph)


@dataclass(frozen=True)
class LoweredLayer:
    insns: np.ndarray
    insn_addr: int
    plan: memory.DramPlan
    meta: dict[str, Any]


def layers_of(graph: Graph, config: AcceleratorConfig) -> list[Layer]:
    """The accelerator layers of a partitioned, packed graph (``weft.compile(..., codegen=False)``)."""
    nonneg = codegen.nonnegative_values(graph, config.acc_width)
    return [Layer(n, graph, codegen.layer_geometry(n, graph, config), n.inputs[0] in nonneg) for n in graph.nodes
            if n.attrs.get("target") == "accel"]


def lower(layer: Layer, schedule: Schedule, config: AcceleratorConfig) -> LoweredLayer:
    """The layer's program under `schedule` on a DRAM plan of its own; a BackendError when it does not lower."""
    c, node, graph = config, layer.node, layer.graph
    tensorize(c, codegen.intrinsic(c))
    plan = memory.DramPlan(c)
    # Every activation where the whole model's image has it (the back end places them first); only the
    # constants before this layer's (earlier layers' weights and programs) are missing.
    values = codegen.place_values(graph, [n for n in graph.nodes if n.attrs.get("target") == "accel"], c, plan)
    meta = codegen.lower_layer(node, graph, c, plan, values, schedule, True, layer.nonnegative)
    addr = meta["insn_addr"]
    data = next(d for a, d in plan.chunks if a == addr)
    return LoweredLayer(decode_insns(c, np.frombuffer(data, dtype=np.uint8)), addr, plan, meta)


class Measurer(Protocol):
    """Cycles of one layer under one schedule; raises (BackendError, ValueError) when it cannot run."""

    name: str

    def measure(self, layer: Layer, schedule: Schedule) -> int: ...


class TimingMeasurer:
    """The timing model's cycles for the lowered program (timing does not depend on the data)."""

    name = "timing"

    def __init__(self, config: AcceleratorConfig) -> None:
        self.config = config
        self.model = TimingModel(config)

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        low = lower(layer, schedule, self.config)
        return int(self.model.simulate(low.insns, low.insn_addr).cycles)


class RtlMeasurer:
    """The RTL's cycle counter for the lowered program (Verilator or Icarus through cocotb; the DRAM answers
    with the timing model's default, the PYNQ-Z1 timing), on an image of zero activations and the layer's
    constants. A run that stops with an error code is an error, never a measurement."""

    name = "rtl"

    def __init__(self, config: AcceleratorConfig, sim: str = "verilator", timing: str = "pynq") -> None:
        self.config, self.sim, self.timing = config, sim, timing

    def measure(self, layer: Layer, schedule: Schedule) -> int:
        low = lower(layer, schedule, self.config)
        image = low.plan.image(0)
        job = Job(dram=image, insn_addr=low.insn_addr, insn_count=len(low.insns), label=layer.geom.name)
        result = run_jobs(self.config, self.sim, [job], timing=self.timing)[0]
        if result.error_code:
            raise ValueError(f"layer '{layer.geom.name}': the RTL stopped with error code {result.error_code} "
                             f"under {schedule}")
        return result.cycles
