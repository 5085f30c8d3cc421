"""RTL traces: the rtl device records each unit's busy and stall intervals from the simulated hardware
(edge triggers in the testbench); per layer they sum to the RTL's own counters to the cycle, match the
stream instruction for instruction, and agree with the timing model's trace within its accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest

import weft
from weft.cli import main
from weft.isa import MemId, ProgramBuilder
from weft.isa.semantics import UNIT_NAMES
from weft.runtime.devices import DeviceError
from weft.runtime.trace import activity_rows, layer_timings, trace_document
from weft.sim.fsim import INSN_KINDS

from .driver_util import RTL_SIMULATORS, compiled

#: The timing model's accuracy against the RTL on `tiny` with the Pynq-like DRAM (tests/test_timing_rtl.py
#: holds it to 10% on harder streams; on this model's layers it is within 1%).
TOLERANCE = 0.05


@pytest.fixture(scope="module", params=RTL_SIMULATORS)
def traced(request):
    """The small MLP on `tiny` through the rtl device with trace=True, and the counters after each layer."""
    art, feeds = compiled("mlp")
    counters: dict[str, dict[str, int]] = {}
    # (layer by layer: a chain's program is one trace, tests/test_trace.py splits the model's)
    sess = weft.InferenceSession(art, device="rtl", simulator=request.param, trace=True, chains=False)

    def after(layer, dram, when):
        if when == "after":  # the counters hold until the next START
            counters[layer["name"]] = sess.device.driver.counters()

    sess.device.on_layer = after
    try:
        outputs = sess.run(None, feeds)
        yield art, feeds, sess, outputs, counters
    finally:
        sess.device.close()


@pytest.mark.rtl
def test_busy_and_stall_intervals_sum_to_the_rtl_counters(traced):
    art, _, sess, _, counters = traced
    layers = sess.device.trace_layers
    accel = [layer["name"] for layer in art.sections["accel"].meta["layers"]]
    assert [lt.name for lt in layers] == accel and len(counters) == len(accel)
    offset = 0
    for lt in layers:
        c = counters[lt.name]
        assert lt.cycles == c["cycles"] and lt.offset == offset
        offset += lt.cycles
        rows = lt.trace
        assert rows["index"].tolist() == list(range(len(rows))) and len(rows) == c["insns"]
        for u, unit in enumerate(UNIT_NAMES):
            mine = rows[rows["unit"] == u]
            # A slice starts in the cycle the unit takes the instruction, one before busy rises; the compute
            # unit's two pipes may overlap (spec "beside"): its busy cycles are their union.
            busy = np.zeros(lt.cycles + 1, bool)
            for start, end in zip(mine["start"], mine["end"], strict=True):
                busy[int(start) + 1:int(end)] = True
            assert int(busy.sum()) == c[f"busy_{unit}"], (lt.name, unit)
            assert int((mine["start"] - mine["ready"]).sum()) == c[f"stall_{unit}"], (lt.name, unit)
            assert np.all(mine["start"][1:] > mine["start"][:-1]), "a unit takes its instructions in order"
            alu = mine["kind"] == INSN_KINDS.index("alu")
            for pipe in ((alu, ~alu) if unit == "compute" else (np.ones(len(mine), bool),)):
                starts, ends = mine[pipe]["start"], mine[pipe]["end"]
                assert np.all(starts[1:] >= ends[:-1]), "a unit (a compute pipe) runs one instruction at a time"
        assert rows["start"].min() >= 0 and rows["end"].max() <= lt.cycles


@pytest.mark.rtl
def test_the_rtl_trace_agrees_with_the_timing_model(traced):
    art, _, sess, _, _ = traced
    for rtl, model in zip(sess.device.trace_layers, layer_timings(art, chains=False), strict=True):
        assert rtl.name == model.name
        # The same instructions on the same units, of the same kinds.
        for field in ("index", "unit", "kind"):
            np.testing.assert_array_equal(rtl.trace[field], model.trace[field])
        assert abs(rtl.cycles - model.cycles) <= TOLERANCE * rtl.cycles, (rtl.name, rtl.cycles, model.cycles)
        for u, unit in enumerate(UNIT_NAMES):
            busy_rtl = (rtl.trace["end"] - rtl.trace["start"])[rtl.trace["unit"] == u].sum()
            busy_model = (model.trace["end"] - model.trace["start"])[model.trace["unit"] == u].sum()
            assert abs(busy_rtl - busy_model) <= TOLERANCE * rtl.cycles, (rtl.name, unit, busy_rtl, busy_model)


@pytest.mark.rtl
def test_the_traced_run_is_still_bit_exact(traced):
    art, feeds, _, outputs, _ = traced
    for f, r in zip(weft.InferenceSession(art, device="fsim").run(None, feeds), outputs, strict=True):
        np.testing.assert_array_equal(f, r)


@pytest.mark.rtl
def test_the_document_says_its_source_and_has_one_slice_per_instruction(traced):
    art, _, sess, _, _ = traced
    doc = trace_document(art, sess.device.trace_layers)
    assert doc["otherData"]["source"] == "rtl"
    assert doc["otherData"]["cycles"] == sum(lt.cycles for lt in sess.device.trace_layers)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] < 3 and e["name"] != "stall"]
    assert len(slices) == sum(len(lt.trace) for lt in sess.device.trace_layers)
    assert {e["args"]["layer"] for e in slices} == {lt.name for lt in sess.device.trace_layers}
    assert trace_document(art)["otherData"]["source"] == "timing model"


@pytest.mark.rtl
def test_weft_run_on_rtl_writes_the_rtl_trace(tmp_path, capsys):
    art, _ = compiled("mlp")
    path = art.save(tmp_path / "m.weft")
    assert main(["run", str(path), "--device", "rtl", "--trace", str(tmp_path / "t.json"), "--no-progress"]) == 0
    assert "rtl)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["otherData"]["source"] == "rtl"
    assert doc["otherData"]["cycles"] == sum(e["args"]["cycles"] for e in doc["traceEvents"]
                                             if e["ph"] == "X" and e["tid"] == 3)


def _program():
    p = ProgramBuilder()
    p.load(MemId.INP, 0, 0, 1, 1)
    p.store(0, 0, 1, 1)
    p.finish()
    return p.insns


def test_activity_rows_places_stalls_and_refuses_a_count_that_does_not_match():
    config = weft.load_config("tiny")
    insns = _program()
    intervals = {"run": [(100, 120)], "load": [(102, 110)], "compute": [(115, 116)], "store": [(111, 114)],
                 "stall_load": [], "stall_compute": [], "stall_store": [(104, 104), (105, 108), (108, 110)]}
    rows, cycles = activity_rows(config, insns, intervals)
    assert cycles == 20
    assert rows[["ready", "start", "end"]].tolist() == [(1, 1, 10), (5, 10, 14), (14, 14, 16)]
    intervals["store"] = []
    with pytest.raises(DeviceError, match="store unit was busy 0 times for 1 instructions"):
        activity_rows(config, insns, intervals)
    with pytest.raises(DeviceError, match="2 runs"):
        activity_rows(config, insns, {**intervals, "run": [(0, 5), (9, 20)]})
