"""Chrome/Perfetto traces of an artifact's accelerator activity, from the timing model.

Each accelerator layer's program is timed by :class:`weft.sim.timing.TimingModel` (timing does not depend
on the data, so no run is needed); layers follow each other on one time axis as the runtime issues them.
The trace has one track per unit (load, compute, store) with one "X" slice per instruction and its stall,
a slice per layer on a "layers" track, and a counter of how many units are busy, so the overlap that
latency hiding buys shows as stacked slices and a counter above 1. Open it in ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from weft.isa.encoding import decode_insns
from weft.runtime.artifact import Artifact, write_atomic
from weft.runtime.devices import DeviceError

__all__ = ["LayerTiming", "layer_timings", "trace_document", "write_trace"]

SECTION = "accel"
#: Track id of the per-layer slices, after the unit tracks (0..2).
_LAYER_TID = 3


class LayerTiming:
    """One accelerator layer's program as the timing model sees it: its name, start offset and report."""

    def __init__(self, name: str, op: str, offset: int, report: Any):
        self.name = name
        self.op = op
        self.offset = offset
        self.report = report


def layer_timings(artifact: Artifact) -> list[LayerTiming]:
    """Time every accelerator layer of `artifact`, in program order, on its own config."""
    from weft.sim.timing import TimingModel

    if SECTION not in artifact.sections:
        raise DeviceError("the artifact has no instruction streams (section 'accel'): a trace needs an "
                          "artifact compiled for the accelerator")
    section = artifact.sections[SECTION]
    meta = section.meta
    const = section.array("const")
    model = TimingModel(artifact.config)
    ops = {node.name: node.op for node in artifact.graph.nodes}
    out: list[LayerTiming] = []
    offset = 0
    for layer in meta["layers"]:
        start = layer["insn_addr"] - meta["const_base"]
        words = const[start:start + layer["insn_count"] * layer["insn_bytes"]]
        report = model.simulate(decode_insns(artifact.config, words), layer["insn_addr"])
        out.append(LayerTiming(layer["name"], ops.get(layer["name"], "?"), offset, report))
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


def trace_document(artifact: Artifact) -> dict[str, Any]:
    """The Chrome trace-event JSON object (``traceEvents`` in microseconds at the config's clock)."""
    from weft.sim.timing import trace_events

    config = artifact.config
    us = 1.0 / config.clock_mhz
    events: list[dict[str, Any]] = []
    timings = layer_timings(artifact)
    for i, lt in enumerate(timings):
        layer_events = trace_events(lt.report.trace, config.clock_mhz, name=config.name)
        if i:  # the process and thread names once
            layer_events = [e for e in layer_events if e["ph"] != "M"]
        for e in layer_events:
            if "ts" in e:
                e["ts"] += lt.offset * us
                e["args"]["layer"] = lt.name
        events.extend(layer_events)
        events.append({"ph": "X", "pid": 0, "tid": _LAYER_TID, "name": lt.name, "ts": lt.offset * us,
                       "dur": lt.report.cycles * us,
                       "args": {"op": lt.op, "cycles": lt.report.cycles,
                                "utilization": lt.report.utilization}})
        events.extend(_busy_counter(lt.report.trace, lt.offset, us, 0))
    events.append({"ph": "M", "pid": 0, "tid": _LAYER_TID, "name": "thread_name", "args": {"name": "layers"}})
    total = sum(int(lt.report.cycles) for lt in timings)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"config": config.name, "config_hash": config.hash, "clock_mhz": config.clock_mhz,
                          "cycles": total, "source": "timing model"}}


def write_trace(artifact: Artifact, path: str | Path) -> dict[str, Any]:
    """Write the trace of `artifact` to `path` (JSON); returns the document's ``otherData``."""
    doc = trace_document(artifact)
    write_atomic(Path(path), json.dumps(doc).encode())
    return doc["otherData"]
