"""The tuner: space, cost model, explorer, log, resume, compile hook and command (tiny config, few trials)."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest

from weft.compiler.backend.codegen import BackendError
from weft.compiler.backend.schedule import fits
from weft.compiler.driver import compile_model
from weft.compiler.models import small_resnet
from weft.compiler.tune import TuningLog, best_schedules, tune_layer, workload_key
from weft.compiler.tune.cost_model import XGBCostModel
from weft.compiler.tune.measure import TimingMeasurer, lower
from weft.compiler.tune.space import SearchSpace
from weft.core.errors import CalibrationWarning

from .tune_util import accel_layers


@pytest.fixture(scope="module")
def setup():
    cfg, layers = accel_layers()
    # The smallest conv layer keeps the tests fast.
    small = min((x for x in layers if x.geom.kind == "conv"), key=lambda x: x.geom.ho * x.geom.wo * x.geom.icb)
    return cfg, layers, small


def test_space_points_and_neighbours_stay_legal(setup):
    cfg, _, layer = setup
    sp = SearchSpace(layer.geom, cfg)
    assert len(sp) > 10 and all(fits(layer.geom, s, cfg) for s in sp.points)
    rng = random.Random(0)
    s = sp.sample(rng)
    for _ in range(50):
        n = sp.neighbour(s, rng)
        assert n in sp
        diff = [k for k in s.to_dict() if s.to_dict()[k] != n.to_dict()[k]]
        assert len(diff) <= 1
        s = n
    assert sp.features(sp.points[:5]).shape[0] == 5


def test_cost_model_ranks_the_training_order():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(60, 3))
    cycles = 1000 + 100 * x[:, 0] + 5 * x[:, 1]
    model = XGBCostModel(seed=0)
    model.fit(x, cycles)
    score = model.predict(x)
    # Higher score, fewer cycles: the model's best is among the truly best fifth.
    assert cycles[np.argmax(score)] <= np.quantile(cycles, 0.2)
    assert np.corrcoef(score, -cycles)[0, 1] > 0.8


def test_timing_measurer_agrees_with_the_whole_compile(setup):
    """The tuner times a layer on its own image; the whole model's program of the same schedule differs
    only in where its constants lie (the odd 4 KiB burst split), so within 1%."""
    from weft.runtime.fsim_device import FsimDevice

    cfg, _, layer = setup
    sp = SearchSpace(layer.geom, cfg)
    m = TimingMeasurer(cfg)
    rng = random.Random(5)
    checked = 0
    while checked < 2:
        s = sp.sample(rng)
        try:
            low = lower(layer, s, cfg)
        except BackendError:  # a schedule whose exact micro-op count does not fit: the tuner logs a failure
            continue
        assert low.meta["schedule"] == s.to_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            art = compile_model(small_resnet(), config=cfg, schedules={layer.geom.name: s})
        device = FsimDevice(cfg, chains=False)  # (the layer's own program, as the measurer times it)
        device.load(art)
        whole = device.layer_cycles(device.layers[layer.geom.name])
        assert abs(m.measure(layer, s) - whole) <= 0.01 * whole
        checked += 1


@pytest.mark.parametrize("tuner", ["xgb", "random"])
def test_tune_logs_resumes_and_feeds_compile(setup, tmp_path, tuner):
    cfg, _, layer = setup
    path = tmp_path / "log.jsonl"
    m = TimingMeasurer(cfg)
    r = tune_layer(layer, cfg, m, trials=10, tuner=tuner, log=TuningLog(path), seed=1, batch=4)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 10 == len(r.history)
    assert {x["workload"] for x in lines} == {workload_key(layer.geom)} and {x["config"] for x in lines} == {cfg.hash}
    ok = [x["cycles"] for x in lines if x["cycles"] is not None]
    assert r.best_cycles == min(ok)
    # The back end's own choice is the first trial, so tuning never loses to it.
    assert lines[0]["schedule"] == r.default.to_dict() and r.best_cycles <= r.default_cycles
    # Resuming to 14 trials measures only 4 new, distinct points.
    r2 = tune_layer(layer, cfg, m, trials=14, tuner=tuner, log=TuningLog(path), seed=2, batch=4)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 14 == len(r2.history)
    assert len({json.dumps(x["schedule"], sort_keys=True) for x in lines}) == 14
    # The compile hook picks the logged best for every layer of that workload.
    chosen = best_schedules(path, [layer.geom], cfg)
    assert chosen[layer.geom.name].to_dict() == r2.best.to_dict()


def test_compile_with_tuning_log_uses_the_best_schedule(setup, tmp_path):
    """The logged best competes with the default's choice, each with its fastest lowering options (which the
    tuner does not time): the compile keeps the faster, so the log never makes the layer slower."""
    from weft.runtime.fsim_device import FsimDevice

    cfg, _, layer = setup
    path = tmp_path / "log.jsonl"
    r = tune_layer(layer, cfg, TimingMeasurer(cfg), trials=6, tuner="random", log=TuningLog(path), seed=3)
    arts = []
    for log in (None, path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            arts.append(compile_model(small_resnet(), config=cfg, tuning_log=log))
    plain, tuned = ({x["name"]: x for x in art.sections["accel"].meta["layers"]} for art in arts)
    cycles = []
    for art in arts:
        device = FsimDevice(cfg)
        device.load(art)
        cycles.append(int(device.layer_cycles(device.layers[layer.geom.name])))
    assert tuned[layer.geom.name]["schedule"] in (r.best.to_dict(), plain[layer.geom.name]["schedule"])
    assert cycles[1] <= min(cycles[0], r.best_cycles)
    assert layer.geom.name in arts[1].meta["tuning_log"]["tuned_layers"]


def test_a_logged_schedule_slower_than_the_default_is_not_compiled(setup):
    """A log from another build of the compiler (or measured without the lowering options) may hold a
    schedule slower than what the compile finds now: the default's choice is kept."""
    from weft.compiler.backend import codegen
    from weft.compiler.backend.schedule import Schedule

    cfg, _, layer = setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        arts = [compile_model(small_resnet(), config=cfg, codegen=False) for _ in range(2)]
    default = codegen.generate(arts[0])
    chosen = next(x for x in default["layers"] if x["name"] == layer.geom.name)["schedule"]
    assert chosen["vthreads"] == 2
    slower = Schedule.from_dict(chosen).without_latency_hiding()  # the same tiles, one thread
    meta = codegen.generate(arts[1], tuned={layer.geom.name: slower})
    assert next(x for x in meta["layers"] if x["name"] == layer.geom.name)["schedule"] == chosen


def test_log_rejects_bad_lines_by_line_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"workload": "w", "config": "c", "schedule": {}}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: tuning record lacks 'cycles'"):
        TuningLog(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not a JSON record"):
        TuningLog(path)


def test_tune_command_and_show(setup, tmp_path, capsys):
    from weft.cli import main
    from weft.compiler.tune.log import TuningLog as Log

    _, _, layer = setup
    model = tmp_path / "m.onnx"
    model.write_bytes(small_resnet().SerializeToString())
    log = tmp_path / "t.jsonl"
    assert main(["tune", str(model), "--config", "tiny", "--trials", "3", "--tuner", "random",
                 "--layers", layer.geom.name, "-o", str(log)]) == 0
    assert len(Log(log).records) == 3
    capsys.readouterr()
    assert main(["tune", "--show", str(log), str(log), "--config", "tiny"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["trials"] == 6 and rows[0]["best_cycles"] is not None


@pytest.mark.slow
@pytest.mark.rtl
def test_rtl_measurer_agrees_with_the_timing_model(setup):
    """The RTL's cycle counter for a tuned layer's program (Verilator) against the timing model's figure
    (calibrated to within a few percent of the RTL)."""
    from weft.compiler.tune.measure import RtlMeasurer

    cfg, _, layer = setup
    s = SearchSpace(layer.geom, cfg).points[0]
    rtl = RtlMeasurer(cfg).measure(layer, s)
    model = TimingMeasurer(cfg).measure(layer, s)
    assert abs(rtl - model) <= 0.05 * rtl


def test_progress_bar_draws_tenths_to_a_log():
    import io
    import re

    from weft.progress import Progress

    out = io.StringIO()
    bar = Progress(20, "conv", stream=out, width=10, log_tenths=True)
    for done in range(21):
        bar.advance(1 if done else 0, f"best {100 - done}")
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and re.fullmatch(r"conv \[#{10}\] 20/20 \d+s best 80", lines[-1])
    # A batch that jumps over tenths writes one line, and a bar without log_tenths writes none to a log.
    bar = Progress(20, "conv", stream=(out := io.StringIO()), log_tenths=True)
    bar.advance(7)
    bar.advance(13)
    assert len(out.getvalue().splitlines()) == 2
    bar = Progress(20, "conv", stream=(out := io.StringIO()))
    bar.advance(20)
    assert out.getvalue() == ""


def test_compile_command_takes_a_tuning_log(setup, tmp_path, capsys):
    from weft.cli import main
    from weft.core.artifact import Artifact

    cfg, _, layer = setup
    log = tmp_path / "t.jsonl"
    r = tune_layer(layer, cfg, TimingMeasurer(cfg), trials=3, tuner="random", log=TuningLog(log), seed=4)
    model = tmp_path / "m.onnx"
    model.write_bytes(small_resnet().SerializeToString())
    out = tmp_path / "m.weft"
    assert main(["compile", str(model), "--config", "tiny", "--tuning-log", str(log), "-o", str(out)]) == 0
    art = Artifact.load(out)
    by_name = {x["name"]: x for x in art.sections["accel"].meta["layers"]}
    assert by_name[layer.geom.name]["schedule"] == r.best.to_dict()


def test_bench_tune_compares_tuners_and_never_loses_to_the_default(setup):
    from weft.tools.bench_tune import bench_tune

    _, _, layer = setup
    out = bench_tune("tiny", model="small_resnet", trials=4, seeds=1, layers=layer.geom.name, batch=2)
    (row,) = out["layers"]
    assert row["layer"] == layer.geom.name and len(row["xgb_trials_to_95"]) == 1
    assert row["tuned_cycles"] <= row["default_cycles"]
    assert out["model_cycles_tuned"] <= out["model_cycles_default"]
    assert out["model_cycles_default"] - out["model_cycles_tuned"] >= row["default_cycles"] - row["tuned_cycles"] - \
        0.01 * row["default_cycles"]


def test_a_logged_schedule_faster_than_the_default_is_compiled(setup, monkeypatch):
    """The converse: where the default's candidates are slow (here each made one-threaded), the logged
    schedule, faster, is the one compiled, with its own fastest options."""
    from weft.compiler.backend import codegen
    from weft.compiler.backend.schedule import Schedule

    cfg, _, layer = setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        arts = [compile_model(small_resnet(), config=cfg, codegen=False) for _ in range(2)]
    default = codegen.generate(arts[0])
    chosen = next(x for x in default["layers"] if x["name"] == layer.geom.name)
    assert chosen["schedule"]["vthreads"] == 2
    plain = codegen._schedule_for

    def slow(node, geom, config, given):
        found = plain(node, geom, config, given)
        return found if given is not None else [s.without_latency_hiding() for s in found]

    monkeypatch.setattr(codegen, "_schedule_for", slow)
    meta = codegen.generate(arts[1], tuned={layer.geom.name: Schedule.from_dict(chosen["schedule"])})
    got = next(x for x in meta["layers"] if x["name"] == layer.geom.name)
    assert got["schedule"] == chosen["schedule"] and got["lowering"] == chosen["lowering"]
