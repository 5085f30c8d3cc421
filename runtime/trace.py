"""Chrome/Perfetto traces of an artifact's accelerator activity, from the timing model or from the RTL.

By default each accelerator layer's program is timed by :class:`weft.sim.timing.TimingModel` (timing does
not depend on the data, so no run is needed; the layers of a chain as its one program, each layer's slice
its part of it, :func:`weft.sim.timing.part_cycles`). On the "rtl" device with ``trace=True`` the rows come from
the simulated hardware instead: the testbench records when each unit's busy and stall signals rise and
fall (:class:`weft.runtime.rtl_server_tb.ActivityRecorder`) and :func:`activity_rows` turns those
intervals into the same per-instruction rows (:data:`weft.sim.timing.TRACE_DTYPE`). Either way layers
follow each other on one time axis as the runtime issues them.

The trace has one track per unit (load, compute, store) with one "X" slice per instruction and its stall,
a slice per layer on a "layers" track, and a counter of how many units are busy, so the overlap that
latency hiding buys shows as stacked slices and a counter above 1. ``otherData.source`` says where the
times come from ("timing model" or "rtl"). Open it in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.accel_section import AccelLayer, accel_section
from weft.core.artifact import Artifact
from weft.core.artifact_schema import ACCEL_SECTION
from weft.core.files import write_atomic
from weft.isa import semantics
from weft.isa.constants import Opcode, Unit
from weft.isa.encoding import decode_insns
from weft.isa.program import insn_kind
from weft.runtime.devices import DeviceError
from weft.sim.fsim import INSN_KINDS
from weft.sim.timing import TRACE_DTYPE, TimingModel, mac_executions, part_cycles, trace_events

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["LayerTiming", "RtlLayer", "activity_rows", "layer_timings", "trace_document", "write_trace"]

#: Track id of the per-layer slices, after the unit tracks (0..2).
_LAYER_TID = 3


class LayerTiming:
    """One accelerator layer's program as the timing model sees it: its name, start offset and report."""

    def __init__(self, name: str, op: str, offset: int, report: Any):
        self.name = name
        self.op = op
        self.offset = offset
        self.report = report

    @property
    def cycles(self) -> int:
        return int(self.report.cycles)

    @property
    def trace(self) -> np.ndarray:
        return self.report.trace

    @property
    def utilization(self) -> float:
        return float(self.report.utilization)


@dataclass
class RtlLayer:
    """One accelerator layer as the RTL ran it: rows from :func:`activity_rows`, its cycles from the start of
    the run (`offset`) and its MAC utilization."""

    name: str
    op: str
    offset: int
    cycles: int
    trace: np.ndarray
    utilization: float


def activity_rows(config: AcceleratorConfig, insns: np.ndarray, intervals: dict[str, list[tuple[int, int]]]
                  ) -> tuple[np.ndarray, int]:
    """(TRACE_DTYPE rows, cycles) of one RTL run of `insns` from the recorder's intervals in clock cycles:
    ``run`` (the core's run flag: exactly one), ``<unit>`` (busy) and ``stall_<unit>`` per unit.

    Each unit runs its instructions in stream order and its busy register drops between two of them, so
    the k-th busy interval of a unit is its k-th instruction; the compute unit's two pipes (spec "beside")
    each have their track (``compute_gemm``: GEMM, its loads and FINISH; ``compute_alu``), which its busy
    is the union of. As in the timing model's rows, an
    instruction starts in the cycle its unit takes it (one cycle before busy rises), ends when busy falls,
    and is ready when the stall that ended as it was taken began (else when it started). So ``end - start
    - 1`` summed over a unit is its busy counter, and ``start - ready`` its stall counter, to the cycle.
    """
    runs = intervals["run"]
    if len(runs) != 1:
        raise DeviceError(f"the RTL trace holds {len(runs)} runs where one was expected")
    origin, end = runs[0]
    units = semantics.units(insns)
    rows = np.zeros(len(insns), dtype=TRACE_DTYPE)
    for u, unit in enumerate(semantics.UNIT_NAMES):
        stall_end = {fall: rise for rise, fall in _merged(intervals[f"stall_{unit}"])}
        mine = np.flatnonzero(units == u)
        tracks = [(unit, mine)]
        if u == Unit.COMPUTE and "compute_alu" in intervals:  # its two pipes, each one at a time
            alu = insns["opcode"][mine] == Opcode.ALU
            tracks = [("compute_gemm", mine[~alu]), ("compute_alu", mine[alu])]
        for track, members in tracks:
            busy = intervals[track]
            if len(busy) != len(members):
                raise DeviceError(f"the RTL's {track.replace('_', ' ')} unit was busy {len(busy)} times for "
                                  f"{len(members)} instructions of its stream (the run stopped early?)")
            for i, (rise, fall) in zip(members.tolist(), busy, strict=True):
                start = rise - 1
                ready = stall_end.get(start, start)
                rows[i] = (i, u, INSN_KINDS.index(_kind(insns[i])), ready - origin, start - origin, fall - origin)
    return rows, end - origin


def _kind(insn: np.void) -> str:
    """The instruction's kind as the functional simulator counts it (an empty LOAD or STORE is a nop)."""
    kind = insn_kind(insn)
    if kind.startswith("load") or kind == "store":
        return kind if int(insn["x_size"]) else "nop"
    return kind


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intervals without empty ones, abutting ones joined (a simulator may show a combinational signal
    glitch within one time step; the hardware's stall never ends and restarts in the same cycle)."""
    out: list[tuple[int, int]] = []
    for rise, fall in spans:
        if fall <= rise:
            continue
        if out and out[-1][1] == rise:
            out[-1] = (out[-1][0], fall)
        else:
            out.append((rise, fall))
    return out


@dataclass
class _Part:
    """A layer's part of a chain's timing report (its rows, times from the part's start: a load that runs
    ahead, beside the layer before, starts before 0)."""

    cycles: int
    trace: np.ndarray
    utilization: float


def _chain_parts(insns: np.ndarray, report: Any, ends: list[int]) -> list[_Part]:
    parts, start = [], 0.0
    for a, b, cycles in zip([0, *ends[:-1]], ends, part_cycles(report.trace, ends), strict=True):
        rows = report.trace[a:b].copy()
        rows["ready"] -= start
        rows["start"] -= start
        rows["end"] -= start
        execs = int(mac_executions(insns[a:b]).sum())  # (the mac_active counter's share of the part)
        parts.append(_Part(cycles, rows, execs / cycles if cycles else 0.0))
        start += cycles
    return parts


def layer_timings(artifact: Artifact, *, chains: bool = True) -> list[LayerTiming]:
    """Time every accelerator layer of `artifact`, in program order, on its own config; with `chains` (as the
    runtime runs them), the layers of a chain (:mod:`weft.compiler.backend.chain`) as its one program, each
    layer its part of it."""
    section = accel_section(artifact)
    if section is None:
        raise DeviceError(f"the artifact has no instruction streams (section '{ACCEL_SECTION}'): a trace needs an "
                          "artifact compiled for the accelerator")
    model = TimingModel(artifact.config)
    ops = {node.name: node.op for node in artifact.graph.nodes}
    out: list[LayerTiming] = []
    offset = 0
    for layer in section.layers:
        if chains and "chain_head" in layer.record:
            continue  # (timed with its chain's first layer)
        chain = layer.record.get("chain") if chains else None
        if chain is not None:
            insns = decode_insns(artifact.config, section.words_at(chain["insn_addr"], chain["insn_count"],
                                                                   layer.insn_bytes))
            report = model.simulate(insns, chain["insn_addr"])
            for name, part in zip(chain["layers"], _chain_parts(insns, report, chain["ends"]),
                                  strict=True):
                out.append(LayerTiming(name, ops.get(name, "?"), offset, part))
                offset += part.cycles
            continue
        relayouts = [AccelLayer(str(p["name"]), int(p["insn_addr"]), int(p["insn_bytes"]), int(p["insn_count"]), (), p)
                     for p in layer.record.get("relayout", ())]  # they run right after the layer's program
        for program, op in ((layer, ops.get(layer.name, "?")), *((r, "relayout") for r in relayouts)):
            report = model.simulate(decode_insns(artifact.config, section.program_words(program)), program.insn_addr)
            out.append(LayerTiming(program.name, op, offset, report))
            offset += int(report.cycles)
    return out


def _busy_counter(trace: np.ndarray, offset: int, us: float, pid: int) -> list[dict[str, Any]]:
    """'C' events: how many units run an instruction at each change (stalls excluded)."""
    changes: dict[float, int] = {}
    for start, end in zip(trace["start"].tolist(), trace["end"].tolist(), strict=True):
        if end > start:
            changes[start] = changes.get(start, 0) + 1
            changes[end] = changes.get(end, 0) - 1
    events = []
    level = 0
    for t in sorted(changes):
        level += changes[t]
        events.append({"ph": "C", "pid": pid, "name": "units busy", "ts": (offset + t) * us,
                       "args": {"busy": level}})
    return events


def trace_document(artifact: Artifact, layers: list[RtlLayer] | None = None) -> dict[str, Any]:
    """The Chrome trace-event JSON object (``traceEvents`` in microseconds at the config's clock): of the
    RTL's `layers` when given (``RtlDevice.trace_layers``), else of the timing model's."""
    config = artifact.config
    us = 1.0 / config.clock_mhz
    events: list[dict[str, Any]] = []
    timings: list[LayerTiming] | list[RtlLayer] = layer_timings(artifact) if layers is None else layers
    if not timings:
        raise DeviceError("nothing to trace: no accelerator layer ran (trace after a run of the session)")
    for i, lt in enumerate(timings):
        layer_events = trace_events(lt.trace, config.clock_mhz, name=config.name)
        if i:  # the process and thread names once
            layer_events = [e for e in layer_events if e["ph"] != "M"]
        for e in layer_events:
            if "ts" in e:
                e["ts"] += lt.offset * us
                e["args"]["layer"] = lt.name
        events.extend(layer_events)
        events.append({"ph": "X", "pid": 0, "tid": _LAYER_TID, "name": lt.name, "ts": lt.offset * us,
                       "dur": lt.cycles * us,
                       "args": {"op": lt.op, "cycles": lt.cycles, "utilization": lt.utilization}})
        events.extend(_busy_counter(lt.trace, lt.offset, us, 0))
    events.append({"ph": "M", "pid": 0, "tid": _LAYER_TID, "name": "thread_name", "args": {"name": "layers"}})
    total = sum(lt.cycles for lt in timings)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"config": config.name, "config_hash": config.hash, "clock_mhz": config.clock_mhz,
                          "cycles": total, "source": "timing model" if layers is None else "rtl"}}


def write_trace(artifact: Artifact, path: str | Path, layers: list[RtlLayer] | None = None) -> dict[str, Any]:
    """Write the trace of `artifact` (of the RTL's `layers` when given) to `path` (JSON); returns the
    document's ``otherData``."""
    doc = trace_document(artifact, layers)
    write_atomic(Path(path), json.dumps(doc).encode())
    return doc["otherData"]
