"""Transfer learning between workloads, the process-pool measurer and the benchmark's resumable cache
(tiny config, few trials)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from weft.compiler.backend.codegen import BackendError
from weft.compiler.models import small_resnet
from weft.compiler.tune import TuningLog, tune_layer
from weft.compiler.tune.cost_model import XGBCostModel
from weft.compiler.tune.measure import TimingMeasurer
from weft.compiler.tune.parallel import PoolMeasurer
from weft.compiler.tune.space import SearchSpace
from weft.compiler.tune.task import AccelTask
from weft.compiler.tune.tuner import Transfer, tune_model

from .tune_util import accel_layers


@pytest.fixture(scope="module")
def setup():
    cfg, layers = accel_layers()
    convs = sorted((x for x in layers if x.geom.kind == "conv"),
                   key=lambda x: x.geom.ho * x.geom.wo * x.geom.icb)
    return cfg, convs


def test_cost_model_ranks_within_groups_of_different_scales():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(80, 2))
    # Two workloads: the same feature decides the order, but one is 100x slower than the other.
    cycles = np.where(np.arange(80) < 40, 1.0, 100.0) * (1000 + 50 * x[:, 0])
    model = XGBCostModel(seed=0)
    model.fit(x, cycles, [40, 40])
    score = model.predict(x[40:])
    assert np.corrcoef(score, -cycles[40:])[0, 1] > 0.8
    with pytest.raises(ValueError, match="groups cover 79 rows, the data has 80"):
        model.fit(x, cycles, [40, 39])


def test_transfer_from_the_log_featurizes_other_workloads_only(setup):
    cfg, convs = setup
    a, b = convs[0], convs[1]
    log = TuningLog()
    m = TimingMeasurer(cfg)
    tune_layer(a, cfg, m, trials=6, tuner="random", log=log, seed=0)
    tune_layer(b, cfg, m, trials=3, tuner="random", log=log, seed=0)
    t = Transfer.from_log(log, AccelTask(b, cfg))
    ok_a = [r for r in log.records if r["workload"] == AccelTask(a, cfg).workload and r["cycles"] is not None]
    assert len(t) == len(ok_a) and len(t.groups) == 1  # b's own records are not transferred
    # Features rebuilt from a logged workload key equal the space's own rows.
    sp = SearchSpace(a.geom, cfg)
    from weft.compiler.backend.schedule import Schedule

    s = Schedule.from_dict(ok_a[0]["schedule"])
    assert np.allclose(t.groups[0][0][0], sp.features([s])[0])


def test_transfer_guides_the_first_batch():
    """Trained only on earlier layers' random measurements, the cost model's first batch on a new layer
    lands where the back end's analytic choice is (random first batches are 1.2-25x slower there)."""
    cfg, layers = accel_layers("small_resnet", "default")
    convs = [x for x in layers if x.geom.kind == "conv"]
    m = TimingMeasurer(cfg)
    prior = Transfer()
    for a in convs[:3]:
        learned = tune_layer(a, cfg, m, trials=8, tuner="random", seed=1, include_default=False)
        prior.add(learned.features, learned.costs)
    guided = tune_layer(convs[3], cfg, m, trials=4, tuner="xgb", seed=0, include_default=False, transfer=prior)
    assert min(c for c in guided.history if c) <= 1.05 * guided.default_cycles


def test_pool_measurer_equals_one_process_and_reports_refusals(setup):
    cfg, convs = setup
    layer = convs[0]
    sp = SearchSpace(layer.geom, cfg)
    schedules = sp.points[:: max(1, len(sp) // 6)][:6]
    local = TimingMeasurer(cfg)
    want = []
    for s in schedules:
        try:
            want.append(local.measure(layer, s))
        except BackendError as err:
            want.append(str(err))
    with PoolMeasurer(lambda: TimingMeasurer(cfg), jobs=2) as pool:
        got = pool.measure_pairs([(convs[1], sp2) for sp2 in SearchSpace(convs[1].geom, cfg).points[:1]] +
                                 [(layer, s) for s in schedules])[1:]
    assert [str(g) if isinstance(g, Exception) else g for g in got] == want


def test_tune_model_transfers_between_layers_in_order(setup):
    cfg, convs = setup
    log = TuningLog()
    results = tune_model(convs[:2], cfg, TimingMeasurer(cfg), trials=5, log=log, show_progress=False)
    assert [r.layer for r in results] == [x.geom.name for x in convs[:2]]
    assert all(r.features is not None and len(r.features) == len(r.costs) for r in results)


def test_bench_tune_resumes_from_its_log(setup, tmp_path):
    from weft.tools.bench_tune import bench_tune

    _, convs = setup
    path = tmp_path / "bench.jsonl"
    first = bench_tune("tiny", model="small_resnet", trials=4, seeds=1, layers=convs[0].geom.name, batch=2, jobs=1,
                       log=str(path))
    assert first["measurements"] > 0 and first["measurements_reused"] == 0
    assert len(path.read_text().splitlines()) == first["measurements"]
    again = bench_tune("tiny", model="small_resnet", trials=4, seeds=1, layers=convs[0].geom.name, batch=2, jobs=1,
                       log=str(path))
    assert again["measurements"] == 0 and again["measurements_reused"] == first["measurements"]
    assert json.dumps(again["layers"]) == json.dumps(first["layers"])
    with pytest.raises(ValueError, match="'nope' is not a conv layer"):
        bench_tune("tiny", model="small_resnet", trials=2, seeds=1, layers="nope", jobs=1)


def test_tune_command_jobs_and_no_transfer(setup, tmp_path):
    from weft.cli import main

    _, convs = setup
    model = tmp_path / "m.onnx"
    model.write_bytes(small_resnet().SerializeToString())
    log = tmp_path / "t.jsonl"
    base = ["tune", str(model), "--config", "tiny", "--trials", "3", "--layers", convs[0].geom.name, "-o", str(log)]
    assert main([*base, "--jobs", "2", "--no-transfer"]) == 0
    assert len(TuningLog(log).records) == 3
    assert main([*base, "--jobs", "2", "--measure", "rtl"]) != 0  # refused: --jobs is for the timing model
