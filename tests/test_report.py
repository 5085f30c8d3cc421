"""`weft report`: the per-layer table (cycles, MACs, utilization, bytes) and the roofline plot."""

from __future__ import annotations

import csv
import json

import pytest

import weft
from weft.cli import main
from weft.compiler import models
from weft.runtime import InferenceSession
from weft.runtime.report import COLUMNS, layer_table, plot_roofline, summary

from .test_frontend_util import rand


@pytest.fixture(scope="module")
def run():
    art = weft.compile(models.mlp(batch=1, in_features=16, hidden=(32,)), config="tiny",
                       calibration={"input": rand(2, 1, 16)})
    sess = InferenceSession(art, device="fsim")
    sess.run(None, {"input": rand(1, 16, seed=5)})
    return art, sess.stats


def test_table_rows_follow_the_runs_figures(run):
    art, stats = run
    config = art.config
    rows = layer_table(stats, config)
    assert [r["layer"] for r in rows] == [layer["name"] for layer in stats["layers"]]
    for row, layer in zip(rows, stats["layers"], strict=True):
        assert set(row) == set(COLUMNS)
        if layer["target"] != "accel":
            assert row["cycles"] is None and row["bytes"] is None and row["utilization"] is None
            continue
        assert row["cycles"] == layer["cycles"] > 0
        assert row["bytes"] == sum(layer["bytes"].values()) > 0
        assert row["macs_per_cycle"] == pytest.approx(layer["macs"] / layer["cycles"])
        assert 0 < row["utilization"] <= row["array_utilization"] <= 1
        assert row["utilization"] == pytest.approx(layer["macs"] / (config.macs_per_cycle * layer["cycles"]))
        assert row["array_utilization"] == pytest.approx(layer["accel_macs"] / (config.macs_per_cycle
                                                                                 * layer["cycles"]))
        ridge = config.macs_per_cycle / (config.bus_width // 8)
        assert row["bound"] == ("compute" if row["intensity"] >= ridge else "memory")
        # Nothing beats the roofline.
        assert row["macs_per_cycle"] <= min(config.macs_per_cycle, row["intensity"] * config.bus_width // 8)
        # Without a DRAM timing a beat moves every cycle: the reads (everything but the outputs) or the
        # writes, whichever take longer, and no layer moves its bytes faster than that.
        written = layer["bytes"]["out"]
        bus = config.bus_width // 8
        assert row["dram_cycles"] == -(-max(row["bytes"] - written, written) // bus)
        assert 0 < row["dram_share"] == row["dram_cycles"] / row["cycles"] <= 1


def test_summary_bounds_the_cycles_by_the_roofline(run):
    art, stats = run
    rows = layer_table(stats, art.config)
    tot = summary(rows)
    accel = [r for r in rows if r["cycles"]]
    assert tot["roofline_cycles"] == sum(max(r["ideal_cycles"], r["dram_cycles"]) for r in accel)
    assert tot["ideal_cycles"] <= tot["roofline_cycles"] <= tot["cycles"]


def test_summary_leaves_dense_layers_out_of_the_spatial_mean(run):
    art, stats = run
    rows = layer_table(stats, art.config)
    convs = [r for r in rows if r["op"] == "qconv2d" and r["cycles"]]
    assert convs and all(r["dense"] for r in convs)  # an MLP: every layer is a dense one
    tot = summary(rows)
    assert tot["spatial_convs_after_first"] == 0 and tot["mean_spatial_conv_utilization_after_first"] is None
    spatial = [{**r, "dense": False} for r in rows]
    tot = summary(spatial)
    after = [r["utilization"] for r in convs[1:]]
    assert tot["spatial_convs_after_first"] == len(after)
    assert tot["mean_spatial_conv_utilization_after_first"] == pytest.approx(sum(after) / len(after))
    # Together, each layer by its size: their ideal over their cycles.
    assert tot["conv_utilization_after_first"] == pytest.approx(
        sum(r["ideal_cycles"] for r in convs[1:]) / sum(r["cycles"] for r in convs[1:]))


def test_dram_cycles_follow_the_timing_the_cycles_were_counted_with(run):
    from weft.sim.dram_timing import TIMINGS

    art, stats = run
    plain = layer_table(stats, art.config)
    pynq = layer_table(stats, art.config, dram=TIMINGS["pynq"])  # a beat on 3 cycles of 4, reads and writes
    for a, b in zip(plain, pynq, strict=True):
        if a["dram_cycles"] is not None:
            assert b["dram_cycles"] >= a["dram_cycles"] * 4 // 3
            assert b["dram_share"] == b["dram_cycles"] / b["cycles"]


def test_roofline_is_a_png(run, tmp_path):
    art, stats = run
    path = plot_roofline(layer_table(stats, art.config), art.config, tmp_path / "roof.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_weft_report_writes_table_csv_json_and_plot(run, tmp_path, capsys):
    art, stats = run
    path = art.save(tmp_path / "m.weft")
    out = tmp_path / "out"
    assert main(["report", str(path), "--csv", f"{out}.csv", "--json", f"{out}.json",
                 "--roofline", f"{out}.png"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == list(COLUMNS)
    assert f"total: {stats['cycles']} cycles" in text
    table = list(csv.DictReader(tmp_path.joinpath("out.csv").read_text().splitlines()))
    assert [r["layer"] for r in table] == [layer["name"] for layer in stats["layers"]]
    rows = json.loads(tmp_path.joinpath("out.json").read_text())
    assert [r["cycles"] for r in rows] == [layer["cycles"] for layer in stats["layers"]]
    assert tmp_path.joinpath("out.png").read_bytes()[:4] == b"\x89PNG"
