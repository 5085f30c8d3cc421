"""Host convolutions tuned against CPU time: the schedule space, the measurer, the log's records (unit
"ns", keyed by the host target), resuming, and the "cpu" device compiling with the fastest logged
schedules while its outputs still match onnxruntime. Small shapes, few trials, one thread."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler.llvm import nn
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.target import host_target
from weft.compiler.tune.host import (
    ConvSpace,
    CpuTimeMeasurer,
    HostConv,
    HostConvTask,
    host_key,
    host_tasks,
    tune_host,
    tuned_schedules,
)
from weft.compiler.tune.log import TuningLog, task_record
from weft.runtime import DeviceError, InferenceSession

from .test_frontend_util import make_model, ort_run, rand

#: float32 against onnxruntime: sums in another order, never other values
RTOL = 1e-5


def _fast() -> CpuTimeMeasurer:
    return CpuTimeMeasurer(repeat=3, min_sample_s=2e-4)


def _model():
    """conv 3x3 16->32 + ReLU, then conv 3x3 32->32 whose output adds the first's (a fused residual)."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    inits = {"w1": rand(32, 16, 3, 3, seed=1, scale=0.1), "b1": rand(32, seed=2),
             "w2": rand(32, 32, 3, 3, seed=3, scale=0.1), "b2": rand(32, seed=4)}
    return make_model(nodes, {"x": [1, 16, 12, 12]}, {"y": [1, 32, 12, 12]}, inits)


@pytest.fixture(scope="module")
def graph():
    return weft.compile(_model(), target="cpu").graph


def _workload(residual: bool = False) -> nn.ConvWorkload:
    spec = nn.ConvSpec(1, 32, 10, 10, 32, 3, 3, (1, 1), 16, 16, out=(8, 8), out_halo=1)
    return nn.ConvWorkload(spec, "clip", (0, 6), Layout(16, 1) if residual else None)


def test_space_points_are_legal_distinct_and_neighbours_change_one_knob():
    target = host_target()
    wl = _workload()
    sp = ConvSpace(wl, target)
    assert len(set(sp.points)) == len(sp) > 10
    assert all(s.illegal_for(wl.spec, target) is None for s in sp.points)
    blocks, ow = wl.spec.cout // wl.spec.bo, wl.spec.out_hw[1]
    legal = {(r, c) for r in range(1, ow + 1) for c in range(1, blocks + 1)
             if ow % r == 0 and blocks % c == 0 and r * c + c <= target.vector_registers}
    assert {(s.r, s.ocb) for s in sp.points} == legal  # every legal tile is searched
    task = HostConvTask("c", wl, 1)
    assert task.defaults()[0] in task.space and task.defaults()[0] == nn.ConvSchedule(*nn.conv_tiles(wl.spec, target))
    rng = random.Random(0)
    for s in rng.sample(sp.points, 12):
        for _ in range(5):
            t = sp.neighbour(s, rng)
            assert t in sp and sum(getattr(s, k) != getattr(t, k) for k in ConvSpace.KNOBS) == 1
    x = sp.features(sp.points)
    assert x.shape[0] == len(sp) and np.isfinite(x).all() and len({tuple(r) for r in x}) == len(sp)
    # a 1x1 convolution over one channel block has one reduction order worth measuring
    one = nn.ConvWorkload(nn.ConvSpec(1, 16, 4, 4, 16, 1, 1, (1, 1), 16, 16))
    assert {s.order for s in ConvSpace(one, target).points} == {nn.REDUCE_LOOPS}


def test_schedules_and_workloads_round_trip_and_refuse_bad_fields():
    wl = _workload(residual=True)
    assert nn.ConvWorkload.from_key(wl.key) == wl and wl.clip == (0.0, 6.0)
    s = nn.ConvSchedule(2, 2, ("rkw", "rco", "rkh"), "ow")
    assert nn.ConvSchedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    for bad in ({"r": 2}, {"r": 2, "ocb": 1, "tile": 3}, {"r": "2", "ocb": 1}, {"r": 2, "ocb": 1, "order": "rco"},
                {"r": 2, "ocb": 1, "outer": "sideways"}, {"r": 0, "ocb": 1}):
        with pytest.raises(ValueError, match="conv schedule"):
            nn.ConvSchedule.from_dict(bad)
    with pytest.raises(ValueError, match="not a conv workload"):
        nn.ConvWorkload.from_key(json.dumps({"kind": "dense"}))
    task = HostConvTask("c", wl, 1)
    assert task.features_of(wl.key, s.to_dict()) is not None
    assert task.features_of('{"c_in":1}', {"tile_h": 1}) is None  # an accelerator layer's record


def test_every_schedule_computes_the_default_values():
    """Schedules reorder sums, nothing else: every point agrees with the heuristic's to float rounding
    (the measurer checks it on each trial too)."""
    from weft.compiler.llvm.jit import build

    target = host_target()
    wl = _workload(residual=True)
    fn0 = build(wl.kernel(target))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(p.shape).astype(np.float32) for p in fn0.params]
    arrays[-1][...] = 0  # the output's halo is never written
    fn0(*arrays)
    want = arrays[-1].copy()
    for s in random.Random(1).sample(ConvSpace(wl, target).points, 8):
        arrays[-1][...] = 0
        build(wl.kernel(target, s))(*arrays)
        assert np.abs(arrays[-1] - want).max() <= RTOL * np.abs(want).max(), s


def test_measurer_times_in_ns_and_names_what_does_not_compile():
    wl = _workload()
    ns = _fast().measure(HostConv("c", wl, 1), nn.ConvSchedule(2, 1))
    assert isinstance(ns, int) and ns > 0
    broken = nn.ConvWorkload(wl.spec, act="gelu")
    with pytest.raises(ValueError, match=r"conv 'c9': schedule \{'r': 2.*does not compile.*gelu"):
        _fast().measure(HostConv("c9", broken, 1), nn.ConvSchedule(2, 1))


def test_measurer_rotates_over_cold_copies_of_the_weights():
    from weft.compiler.llvm.jit import build

    wl = _workload()
    fn = build(wl.kernel(host_target()))
    w = next(k for k, p in enumerate(fn.params) if p.name == "w")
    for cold, want in ((0, 1), (1 << 20, 2 + (1 << 20) // (4 * wl.spec.cout * wl.spec.cin * 9))):
        me = CpuTimeMeasurer(cold_bytes=cold)
        arrays, ptr_sets = me._arrays(HostConv("c", wl, 1), fn)
        assert len(ptr_sets) == want and len({ps[w] for ps in ptr_sets}) == want
        assert all(ps[k] == ptr_sets[0][k] for ps in ptr_sets for k in range(len(arrays)) if k != w)
        assert all(np.array_equal(a, arrays[w]) for a in me._buffers[1][len(arrays):])  # type: ignore[index]


def test_measurer_retries_while_the_machine_is_busy(monkeypatch):
    """A measurement that the probe finds busy (before or after it) is taken again, the fastest kept;
    one never quiet is kept after the last attempt and counted."""
    me = CpuTimeMeasurer(repeat=2, min_sample_s=1e-4, attempts=3)
    busy = iter([True, False, False, False])  # busy before the first attempt, quiet around the second
    times = iter([900, 700])
    monkeypatch.setattr(me, "is_busy", lambda threads: next(busy))
    monkeypatch.setattr(me, "_time", lambda fn, ptrs, threads: next(times))
    assert me.measure(HostConv("c", _workload(), 1), nn.ConvSchedule(2, 1)) == 700
    assert (me.busy_retries, me.busy) == (1, 0)
    monkeypatch.setattr(me, "is_busy", lambda threads: True)
    monkeypatch.setattr(me, "_time", lambda fn, ptrs, threads: 800)
    assert me.measure(HostConv("c", _workload(), 1), nn.ConvSchedule(2, 1)) == 800
    assert (me.busy_retries, me.busy) == (3, 1)
    real = CpuTimeMeasurer()
    assert real.is_busy(1) in (True, False) and 0 < real._fastest < 1e-2  # the probe runs: a call of ~0.25 ms


def test_tuning_logs_ns_records_on_the_host_target_and_resumes(graph, tmp_path):
    path = tmp_path / "host.jsonl"
    results = tune_host(graph, 1, trials=3, log=TuningLog(path), seed=0, batch=2, show_progress=False,
                        measurer=_fast())
    recs = TuningLog(path).records
    tasks = host_tasks(graph, 1)
    assert len(tasks) == 2 and len(results) == 2 and len(recs) == 6
    assert all(r["unit"] == "ns" and r["config"] == host_key(1) == tasks[0].target and r["measurer"] == "cpu"
               and r["cycles"] > 0 and r["error"] is None for r in recs)
    assert {r["workload"] for r in recs} == {t.workload for t in tasks}
    assert all(r.unit == "ns" and r.best_cycles is not None and r.best_cycles <= min(r.history) for r in results)
    # the default is the first trial of each workload
    assert [r["schedule"] for r in recs[::3]] == [t.to_dict(t.defaults()[0]) for t in tasks]
    tune_host(graph, 1, trials=3, log=TuningLog(path), show_progress=False, measurer=_fast())
    assert len(TuningLog(path).records) == 6  # nothing measured twice
    tune_host(graph, 1, trials=4, log=TuningLog(path), show_progress=False, measurer=_fast(),
              layers=[tasks[1].name])
    assert len(TuningLog(path).records) == 7
    with pytest.raises(ValueError, match="'nope' is not a convolution"):
        tune_host(graph, 1, trials=1, layers=["nope"], show_progress=False)


def _log_choosing(graph, path, threads: int = 1) -> dict[str, nn.ConvSchedule]:
    """A log whose fastest record of each conv is a non-default schedule (another one slower, and a
    failure), written as the tuner writes records."""
    log = TuningLog(path)
    chosen = {}
    for t in host_tasks(graph, threads):
        default = t.defaults()[0]
        others = [s for s in t.space.points if s.r != default.r and s.outer != default.outer]
        chosen[t.name] = others[0]
        for s, ns in ((default, 900), (others[0], 500), (others[1], 700), (others[2], None)):
            log.add(task_record(t.workload, t.target, t.name, s.to_dict(), ns, "cpu", "x" if ns is None else None,
                                "ns"))
    return chosen


def test_cpu_device_runs_the_fastest_logged_schedules(graph, tmp_path):
    path = tmp_path / "host.jsonl"
    chosen = _log_choosing(graph, path)
    art = weft.compile(_model(), target="cpu")
    x = {"x": rand(1, 16, 12, 12, seed=5)}
    want = ort_run(_model(), x)[0]
    plain = InferenceSession(art, device="cpu", threads=1)
    tuned = InferenceSession(art, device="cpu", threads=1, tuning_log=str(path))
    convs = tuned.device.plan.convs
    assert {n: s for n, (_, s, was_tuned) in convs.items() if was_tuned} == chosen
    assert not any(t for _, _, t in plain.device.plan.convs.values())
    for sess in (plain, tuned):
        got = sess.run(None, x)[0]
        assert np.abs(got - want).max() <= RTOL * np.abs(want).max()
    assert tuned.stats["tuned_convs"] == 2 and plain.stats["tuned_convs"] == 0


def test_logs_of_another_target_or_broken_logs_are_ignored_or_refused(graph, tmp_path):
    other = tmp_path / "two_threads.jsonl"
    _log_choosing(graph, other, threads=2)
    with pytest.warns(UserWarning, match=r"no records for host target .*threads=1 \(it has: .*threads=2\)"):
        assert tuned_schedules(other, 1) == {}
    assert len(tuned_schedules(other, 2)) == 2
    # records that are not legal here, or not conv schedules, are skipped; the rest still count
    mixed = tmp_path / "mixed.jsonl"
    chosen = _log_choosing(graph, mixed)
    log = TuningLog(mixed)
    task = host_tasks(graph, 1)[0]
    log.add(task_record(task.workload, task.target, task.name, {"r": 5, "ocb": 1}, 1, "cpu", None, "ns"))
    log.add(task_record(task.workload, task.target, task.name, {"tile_h": 1}, 1, "cpu", None, "ns"))
    log.add(task_record('{"c_in":1}', task.target, "acc", {"tile_h": 1}, 1, "timing"))
    assert tuned_schedules(mixed, 1)[task.workload] == chosen[task.name]
    art = weft.compile(_model(), target="cpu")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(mixed.read_text() + "not json\n")
    with pytest.raises(DeviceError, match=r"bad.jsonl:\d+: not a JSON record"):
        InferenceSession(art, device="cpu", threads=1, tuning_log=str(bad))
    with pytest.raises(DeviceError, match=r"tuning log .*missing.jsonl' does not exist"):
        InferenceSession(art, device="cpu", threads=1, tuning_log=str(tmp_path / "missing.jsonl"))
    from weft.compiler.llvm.graph import plan_graph

    with pytest.raises(ValueError, match="needs `threads`"):
        plan_graph(art.graph, tuning_log=mixed)


def test_tune_and_run_commands(tmp_path, capsys):
    from weft.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(_model().SerializeToString())
    log = tmp_path / "cpu.jsonl"
    assert main(["tune", str(model), "--target", "cpu", "--threads", "1", "--trials", "2", "--tuner", "random",
                 "-o", str(log)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(r["unit"] == "ns" and r["best_cycles"] > 0 for r in rows)
    assert main(["tune", str(model), "--target", "cpu", "--jobs", "2", "-o", str(log)]) == 2  # refused
    capsys.readouterr()
    assert main(["tune", "--show", str(log)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown) == 2 and all(r["unit"] == "ns" and r["best_schedule"]["r"] >= 1 for r in shown)
    art = tmp_path / "m.weft"
    assert main(["compile", str(model), "--target", "cpu", "-o", str(art)]) == 0
    stats = tmp_path / "stats.json"
    assert main(["run", str(art), "--device", "cpu", "--device-option", "threads=1", "--device-option",
                 f"tuning_log={log}", "--stats", str(stats)]) == 0
    assert json.loads(stats.read_text())["tuned_convs"] == 2
