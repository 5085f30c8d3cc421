"""`weft run --trace`: a Chrome trace-event file of the timing model's load, compute and store activity."""

from __future__ import annotations

import itertools
import json

import pytest

import weft
from weft.cli import main
from weft.compiler import models
from weft.isa.semantics import UNIT_NAMES
from weft.runtime import InferenceSession
from weft.runtime.trace import layer_timings, write_trace

from .test_frontend_util import rand


@pytest.fixture(scope="module")
def art():
    return weft.compile(models.mlp(batch=1, in_features=16, hidden=(32,)), config="tiny",
                        calibration={"input": rand(2, 1, 16)})


def test_trace_loads_back_with_one_slice_per_instruction_and_the_runs_cycles(art, tmp_path):
    info = write_trace(art, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert [names[u] for u in range(len(UNIT_NAMES))] == list(UNIT_NAMES) and names[3] == "layers"
    sess = InferenceSession(art, device="fsim")
    sess.run(None, {"input": rand(1, 16, seed=3)})
    accel = [layer for layer in sess.stats["layers"] if layer["target"] == "accel"]
    insns = [e for e in events if e["ph"] == "X" and e["tid"] < 3 and e["name"] != "stall"]
    assert len(insns) == sum(layer["insn_count"] for layer in accel)
    layers = [e for e in events if e["ph"] == "X" and e["tid"] == 3]
    assert [e["name"] for e in layers] == [layer["name"] for layer in accel]
    assert [e["args"]["cycles"] for e in layers] == [layer["cycles"] for layer in accel]
    assert info["cycles"] == sess.stats["cycles"]
    us = 1 / art.config.clock_mhz
    chained = {r["name"] for r in accel if "chain" in r and r["chain"] != r["name"]}
    assert chained, "the MLP's layers run as one chain"
    before = None
    for layer in layers:  # each instruction ends inside its layer's slice and starts there too, or, in a
        inside = [e for e in insns if e["args"]["layer"] == layer["name"]]  # chain, in the layer before's
        assert inside and all(e["ts"] + e["dur"] <= layer["ts"] + layer["dur"] + us for e in inside)
        start = before["ts"] if layer["name"] in chained else layer["ts"]
        assert all(start <= e["ts"] for e in inside)
        before = layer
    busy = [e["args"]["busy"] for e in events if e["ph"] == "C"]
    assert max(busy) >= 1 and min(busy) >= 0 and max(busy) <= len(UNIT_NAMES)
    assert busy[-1] == 0


def test_layers_follow_each_other(art):
    timings = layer_timings(art)
    assert timings[0].offset == 0
    for a, b in itertools.pairwise(timings):
        assert b.offset == a.offset + a.report.cycles


def test_weft_run_writes_the_trace(art, tmp_path, capsys):
    path = art.save(tmp_path / "m.weft")
    assert main(["run", str(path), "--device", "fsim", "--trace", str(tmp_path / "tr.json")]) == 0
    assert "trace:" in capsys.readouterr().out
    assert json.loads((tmp_path / "tr.json").read_text())["otherData"]["source"] == "timing model"


def test_a_cpu_artifact_has_no_trace(tmp_path):
    cpu = weft.compile(models.mlp(batch=1, in_features=16, hidden=(32,)), target="cpu")
    with pytest.raises(weft.runtime.DeviceError, match="section 'accel'"):
        write_trace(cpu, tmp_path / "t.json")
