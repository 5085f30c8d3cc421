"""`weft dse`: the sweep grammar, skipped invalid points, the Pareto front, local and Dask sweeps, the CLI."""

from __future__ import annotations

import csv
import importlib.util
import io

import pytest

from weft.cli import main
from weft.compiler import models
from weft.config import load_config
from weft.progress import Progress, progress
from weft.tools.dse import evaluate_point, expand_grid, pareto_front, parse_sweep, run_sweep


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dse") / "mlp.onnx"
    models.save(models.mlp(batch=1, in_features=16, hidden=(32,)), path)
    return path


def test_parse_sweep_and_its_errors():
    assert parse_sweep(["block=8,16", "acc_kib=64"]) == {"block": [8, 16], "acc_kib": [64]}
    for bad, rule in (("blok=8", "unknown knob 'blok'"), ("block", "expected KNOB=V1,V2"),
                      ("block=a", "values must be numbers")):
        with pytest.raises(ValueError, match=rule):
            parse_sweep([bad])
    with pytest.raises(ValueError, match="swept twice"):
        parse_sweep(["bus=64", "bus=128"])


def test_grid_maps_knobs_to_fields_and_skips_what_breaks_a_rule():
    base = load_config("tiny")
    valid, skipped = expand_grid(base, {"block": [4, 8, 3], "acc_kib": [8]})
    assert [(c.block_in, c.block_out, c.acc_buff_bytes) for _, c in valid] == [(4, 4, 8192), (8, 8, 8192)]
    assert valid[1][1].name == "tiny-block8-acc_kib8"
    assert len(skipped) == 1 and skipped[0][0] == {"block": 3, "acc_kib": 8}
    assert "config field 'block_in'" in skipped[0][1]


def test_depth_knob_keeps_every_block_and_batch_of_the_grid_valid():
    base = load_config("default")
    # At the default byte sizes a 1x8x8 point has twice the rows: its GEMM instruction outgrows the word,
    # and the refusal names the field and sizes that fit.
    valid, skipped = expand_grid(base, {"block": [8]})
    assert not valid and "the GEMM instruction needs 132 bits" in skipped[0][1] and "sizes that fit" in skipped[0][1]
    valid, skipped = expand_grid(base, {"block": [8, 16, 32], "batch": [1, 2], "depth": [0.5, 1]})
    assert len(valid) == 12 and not skipped
    for knobs, cfg in valid:
        for memory in ("inp", "wgt", "acc"):
            assert cfg.rows(memory) == base.rows(memory) * knobs["depth"]
        assert cfg.uop_buff_bytes == base.uop_buff_bytes
    # depth 1 at the base's own block and batch is the base design itself.
    assert next(c for k, c in valid if k == {"block": 16, "batch": 1, "depth": 1}).hash == base.hash


def test_pareto_front():
    rows = [{"lut": 10, "latency_us": 9}, {"lut": 20, "latency_us": 5}, {"lut": 20, "latency_us": 6},
            {"lut": 30, "latency_us": 5}, {"error": "x"}, {"lut": 5, "latency_us": 12}]
    assert pareto_front(rows, "lut") == [5, 0, 1]


def test_a_point_that_does_not_compile_reports_its_error(model):
    cfg = load_config("tiny").replace(name="broken")
    row = evaluate_point(b"not an onnx model", cfg.to_dict(), {"block": 4}, area=False)
    assert row["config"] == "broken" and "error" in row and "cycles" not in row


def test_local_sweep_times_each_point(model):
    valid, _ = expand_grid(load_config("tiny"), {"block": [4, 8]})
    done = []
    rows = run_sweep(model.read_bytes(), valid, area=False, workers=2, on_done=done.append)
    assert [r["config"] for r in rows] == ["tiny-block4", "tiny-block8"] and len(done) == 2
    for r, (_, cfg) in zip(rows, valid, strict=True):
        assert "error" not in r and r["cycles"] > 0 and r["latency_us"] == r["cycles"] / cfg.clock_mhz
    # The whole model run on fsim with the timing model takes the cycles its programs are timed at.
    ran = evaluate_point(model.read_bytes(), valid[0][1].to_dict(), {"block": 4}, area=False, fsim=True)
    assert ran["fsim_cycles"] == ran["cycles"] == rows[0]["cycles"]
    # Same compile and timing in this process: a point's cycles do not depend on where it ran.
    assert evaluate_point(model.read_bytes(), valid[1][1].to_dict(), {"block": 8}, area=False)["cycles"] \
        == rows[1]["cycles"]


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask[distributed]")
def test_dask_sweep_matches_the_local_one(model):
    from dask.distributed import LocalCluster

    valid, _ = expand_grid(load_config("tiny"), {"block": [4, 8]})
    local = run_sweep(model.read_bytes(), valid, area=False, workers=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        remote = run_sweep(model.read_bytes(), valid, area=False, scheduler=cluster.scheduler_address)
    assert [(r["config"], r["cycles"]) for r in remote] == [(r["config"], r["cycles"]) for r in local]


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask[distributed]")
def test_weft_dse_on_a_dask_scheduler_writes_the_local_rows(model, tmp_path, capsys):
    from dask.distributed import LocalCluster

    args = ["dse", str(model), "--config", "tiny", "--sweep", "block=4,8", "--sweep", "batch=1,2", "--area", "none"]
    assert main([*args, "--workers", "1", "-o", str(tmp_path / "local")]) == 0
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        assert main([*args, "--scheduler", cluster.scheduler_address, "-o", str(tmp_path / "dask")]) == 0
    capsys.readouterr()
    local, remote = ((tmp_path / f"{stem}.csv").read_text() for stem in ("local", "dask"))
    assert remote == local and len(local.splitlines()) == 5


def test_cached_area_takes_only_what_the_synthesis_cache_holds(model, tmp_path, monkeypatch):
    import json

    from weft.hw.synth import hardware_fingerprint
    from weft.tools.dse import sweep

    monkeypatch.setattr(sweep, "default_cache", lambda: tmp_path)
    (a, cfg_a), (_, cfg_b) = expand_grid(load_config("tiny"), {"block": [4, 8]})[0]
    area = {"lut": 7000, "ff": 4000, "bram36": 3.5, "dsp": 22}
    (tmp_path / "x.json").write_text(json.dumps({"family": "xc7", "config_hash": cfg_a.hash, "area": area,
                                                 "seconds": 12.5, "hardware": hardware_fingerprint()}))
    synthesized = evaluate_point(model.read_bytes(), cfg_a.to_dict(), a, cached_only=True)
    assert {k: synthesized[k] for k in area} == area and synthesized["synth_s"] == 12.5
    assert "pynq-z2" in synthesized["fits"].split(",")
    never = evaluate_point(model.read_bytes(), cfg_b.to_dict(), {"block": 8}, cached_only=True)
    assert never["cycles"] > 0 and "lut" not in never and "fits" not in never and "error" not in never
    # The geometry's estimate stands in, in columns of its own: 8x8 int8 products, two to a DSP.
    assert never["dsp_min"] == 32 and never["bram36_est"] > 0


def test_weft_dse_writes_csv_and_plot(model, tmp_path, capsys):
    stem = tmp_path / "sweep"
    assert main(["dse", str(model), "--config", "tiny", "--sweep", "block=4,8,3", "--area", "none",
                 "--workers", "2", "-o", str(stem)]) == 0
    out = capsys.readouterr()
    assert "skipped tiny-block3: config field" in out.err and "2 points, 1 skipped" in out.out
    rows = list(csv.DictReader(stem.with_suffix(".csv").read_text().splitlines()))
    assert [r["config"] for r in rows] == ["tiny-block4", "tiny-block8", "tiny-block3"]
    assert rows[2]["block"] == "3" and int(rows[1]["cycles"]) > 0 and rows[2]["error"].startswith("config field")
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_weft_dse_resumes_a_sweep_cut_short_from_its_csv(model, tmp_path, capsys):
    """--resume keeps the rows the CSV holds for today's points (same config hash and sources) and runs only
    the rest; a row of other sources, of another config or with an error is run again."""
    stem = tmp_path / "sweep"
    args = ["dse", str(model), "--config", "tiny", "--sweep", "block=4,8", "--sweep", "batch=1,2", "--area", "none",
            "--workers", "1", "-o", str(stem)]
    assert main(args) == 0
    first = list(csv.DictReader(stem.with_suffix(".csv").read_text().splitlines()))
    truth = {r["config"]: r["cycles"] for r in first}
    assert len(first) == 4 and all(r["sources"] for r in first)
    # Mark each row: a kept row keeps its mark, a row run again gets its true cycles back.
    edited = [dict(r, cycles="1234567") for r in first]
    edited[1]["sources"] = "0" * 16  # another weft made it
    edited[2]["config_hash"] = "f" * 16  # another config of that name
    edited[3]["error"] = "CompileError: it broke"
    edited.append(dict(first[0], config="tiny-block16", block="16"))  # not a point of this sweep
    with stem.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*first[0], "error"])
        writer.writeheader()
        writer.writerows(edited)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "resuming: 1 of 4 points" in capsys.readouterr().err
    rows = list(csv.DictReader(stem.with_suffix(".csv").read_text().splitlines()))
    assert [r["config"] for r in rows] == [r["config"] for r in first]
    assert rows[0]["cycles"] == "1234567" and rows[0]["sources"] == first[0]["sources"]
    assert [r["cycles"] for r in rows[1:]] == [truth[r["config"]] for r in rows[1:]]
    assert not any(r.get("error") for r in rows) and sum(r["pareto"] == "True" for r in rows) >= 1
    # Without --resume every point runs; a file that is not a sweep's CSV is refused, not run over.
    assert main(args) == 0
    assert [r["cycles"] for r in csv.DictReader(stem.with_suffix(".csv").read_text().splitlines())] == \
        [truth[r["config"]] for r in first]
    stem.with_suffix(".csv").write_bytes(b"\xff\xfe\x00garbage")
    assert main([*args, "--resume"]) != 0
    assert "not a sweep's CSV" in capsys.readouterr().err
    assert stem.with_suffix(".csv").read_bytes() == b"\xff\xfe\x00garbage"


def test_progress_bar_draws_only_when_enabled():
    shown = io.StringIO()
    assert list(progress(range(3), "t", stream=shown, enabled=True)) == [0, 1, 2]
    assert "3/3" in shown.getvalue() and shown.getvalue().endswith("\n")
    quiet = io.StringIO()
    with Progress(2, "t", stream=quiet) as bar:  # a StringIO is not a terminal
        bar.advance(2)
    assert quiet.getvalue() == ""


def test_pareto_plot_colours_by_board_and_survives_a_sweep_of_errors(tmp_path):
    from weft.tools.dse.pareto import plot_pareto

    rows = [{"config": "t-block4", "lut": 7000, "latency_us": 15.0, "fits": "kv260,pynq-z1", "pareto": True},
            {"config": "t-block64", "lut": 90000, "latency_us": 3.0, "fits": "zcu104", "pareto": True},
            {"config": "t-block128", "lut": 400000, "latency_us": 2.0, "fits": "", "pareto": True}]
    assert plot_pareto(rows, "lut", tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    for r, extra in zip(rows, ({"bram36": 3.5, "dsp": 22}, {"bram36": 100, "dsp": 700}, {"bram36": 400, "dsp": 0}),
                        strict=True):
        r.update(extra)
    panels = plot_pareto(rows, ("lut", "bram36", "dsp"), tmp_path / "c.png", board="pynq-z2")
    assert panels.read_bytes()[:4] == b"\x89PNG"
    errors = [{"config": "t-x", "error": "ConfigError"}]
    assert plot_pareto(errors, "lut", tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
