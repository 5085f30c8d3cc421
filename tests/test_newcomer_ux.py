"""What a newcomer reads (issue 19): no "cycles None", units named, pass descriptions whole, the board-fit
check, a missing bitstream named as such, status lines for long waits, one cache folder, outputs in the
current folder, a JUnit report from the cosimulation."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import pytest

import weft
from weft.cache import cache_dir
from weft.cli import main
from weft.compiler import pipeline
from weft.compiler.tune.tuner import LayerResult
from weft.config import PRESETS
from weft.hw.synth import BOARDS, board_fit, estimate_area, hardware_fingerprint
from weft.progress import Progress, Waiting
from weft.runtime import bitstreams
from weft.runtime.bitstreams import BitstreamError, check_board_fit
from weft.runtime.cli import cycles_text, tuning_log_text
from weft.runtime.deploy import RUN_PY
from weft.runtime.devices import DeviceError
from weft.sim.cosim import RandomReport, SeedResult

from .driver_util import compiled


# ---- small output issues -----------------------------------------------------------------------------------
def test_weft_run_on_ref_says_why_there_are_no_cycles(tmp_path, capsys):
    art, _ = compiled("mlp")
    path = art.save(tmp_path / "mlp.weft")
    assert main(["run", str(path), "--device", "ref"]) == 0
    out = capsys.readouterr().out
    assert "cycles None" not in out
    assert "cycles: n/a (device ref does not count accelerator cycles)" in out


def test_cycles_text_counts_when_there_are_cycles():
    assert cycles_text({"cycles": 12345, "device": "fsim"}) == "12,345 accelerator cycles"


def test_deployed_run_py_never_prints_cycles_none():
    assert "accelerator cycles {stats.get('cycles')}" not in RUN_PY
    assert "cycles: n/a (device {args.device} does not count accelerator cycles)" in RUN_PY


def test_tuning_log_use_is_reported():
    device = SimpleNamespace(plan=SimpleNamespace(convs={"a": 0, "b": 0, "c": 0}))
    assert tuning_log_text(device, {"tuned_convs": 2, "device": "cpu", "threads": 4}, "t.jsonl") == \
        "tuning log t.jsonl: applied to 2 of 3 convolutions"
    unused = tuning_log_text(device, {"tuned_convs": 0, "device": "cpu", "threads": 4}, "t.jsonl")
    assert unused.startswith("tuning log t.jsonl: applied to 0 of 3 convolutions") and "4 threads" in unused


def test_host_tuning_results_name_their_unit():
    r = LayerResult(layer="conv1", workload="w", space=10, default=None, default_cycles=2000, best=None,
                    best_cycles=1000, history=[2000, 1000], unit="ns")
    summary = r.summary()
    assert summary["default_cycles"] == summary["default_ns"] == 2000 and summary["best_ns"] == 1000
    assert r.line() == "conv1: best 1,000 ns, untuned 2,000 ns (2.00x faster) after 2 trials"
    accel = LayerResult(layer="c", workload="w", space=1, default=None, default_cycles=5, best=None,
                        best_cycles=5, history=[5])
    assert "default_ns" not in accel.summary() and "5 cycles" in accel.line()


def test_pass_descriptions_are_not_cut_at_an_abbreviation(capsys):
    def doc() -> None:
        """A clamp (a ReLU, e.g. after an Add. Or not) joins the layer before it. Then more."""

    assert pipeline._first_sentence(doc) == "A clamp (a ReLU, e.g. after an Add. Or not) joins the layer before it."
    assert main(["compile", "--list-passes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.rstrip().endswith("e.g.")]
    assert any(line.startswith("fuse_clamps") and "only reader." in line for line in lines)


# ---- board fit ---------------------------------------------------------------------------------------------
def test_bram_estimate_matches_yosys_on_the_presets_the_readme_reports():
    # Yosys synth_xilinx puts `default` at 116 BRAM36 and `pynq` at 87.5 (one accumulator read port)
    assert estimate_area(PRESETS["default"])["bram36"] == 116
    assert estimate_area(PRESETS["pynq"])["bram36"] == 87.5


@pytest.mark.parametrize(("board", "config", "fits"), [
    ("pynq-z2", "default", True), ("pynq-z2", "pynq", True), ("pynq-z1", "tiny", True),
    ("ultra96-v2", "default", True), ("kv260", "zcu104", True), ("pynq-z2", "zcu104", False),
])
def test_board_fit(board, config, fits, tmp_path):
    fit = board_fit(PRESETS[config], board, cache=tmp_path)
    assert fit["fits"] is fits and fit["part"] == BOARDS[board].name and "estimate" in fit["source"]


def test_a_cached_synthesis_result_wins_over_the_estimate(tmp_path):
    cfg = PRESETS["default"]
    (tmp_path / "abc.json").write_text(json.dumps({"family": "xc7", "config_hash": cfg.hash,
                                                   "hardware": hardware_fingerprint(),
                                                   "area": {"lut": 1, "ff": 1, "bram36": 1, "dsp": 1}}))
    fit = board_fit(cfg, "pynq-z2", cache=tmp_path)
    assert fit["fits"] and fit["source"] == "Yosys synth_xilinx (cached)"


def test_a_cached_result_of_other_hardware_sources_does_not_count(tmp_path):
    # The same config synthesized before the hardware changed (or with no fingerprint: an older weft): its
    # area is not today's design's, so the estimate stands in.
    cfg = PRESETS["zcu104"]
    stale = {"family": "xc7", "config_hash": cfg.hash, "area": {"lut": 1, "ff": 1, "bram36": 1, "dsp": 1}}
    (tmp_path / "old.json").write_text(json.dumps(stale))
    (tmp_path / "older.json").write_text(json.dumps({**stale, "hardware": "0" * 16}))
    fit = board_fit(cfg, "pynq-z2", cache=tmp_path)
    assert not fit["fits"] and "estimate" in fit["source"]


def test_bitstream_refuses_a_config_that_does_not_fit_unless_forced(tmp_path, capsys):
    assert main(["bitstream", "--board", "pynq-z2", "--config", "zcu104", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config 'zcu104' does not fit the xc7z020 of pynq-z2: bram36 215.5 (154%)" in err
    assert "uses config default" in err and "--force" in err
    assert not list(tmp_path.iterdir())
    with pytest.raises(BitstreamError, match="pass --force to go on anyway"):
        check_board_fit("pynq-z1", PRESETS["zcu104"])
    assert "does not fit" in check_board_fit("pynq-z2", PRESETS["zcu104"], force=True)
    assert check_board_fit("pynq-z2", PRESETS["pynq"]) is None


def test_deploy_refuses_a_config_that_does_not_fit_unless_forced(tmp_path, capsys):
    art, _ = compiled("mlp", "zcu104")
    path = art.save(tmp_path / "mlp.weft")
    assert main(["deploy", str(path), "--board", "pynq-z1", "-o", str(tmp_path / "out")]) == 2
    assert "does not fit the xc7z020 of pynq-z1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["deploy", str(path), "--board", "pynq-z1", "-o", str(tmp_path / "out"), "--force"]) == 0
    assert "warning: config 'zcu104' does not fit" in capsys.readouterr().err
    assert (tmp_path / "out" / "run.py").exists()


def test_pynq_names_a_missing_bitstream_file(tmp_path):
    art, _ = compiled("mlp")
    with pytest.raises(DeviceError, match=f"bitstream file {tmp_path / 'weft.bit'} does not exist"):
        weft.InferenceSession(art, device="pynq", bitstream=tmp_path / "weft.bit")


# ---- waits -------------------------------------------------------------------------------------------------
def test_a_wait_writes_a_line_before_and_after_when_not_on_a_terminal():
    stream = io.StringIO()
    with Waiting("building x", "about 1 s", stream=stream):
        pass
    assert stream.getvalue() == "building x (about 1 s)...\nbuilding x: done in 0 s\n"
    stream = io.StringIO()
    with pytest.raises(RuntimeError), Waiting("building x", stream=stream):
        raise RuntimeError
    assert stream.getvalue().endswith("building x: failed after 0 s\n")


def test_a_live_wait_ticks_on_its_own_line_even_under_a_bar():
    stream = io.StringIO()
    with Progress(2, "sweep", stream=stream, enabled=True) as bar:
        bar.advance()
        with Waiting("synth", stream=stream, enabled=True, interval=0.05):
            time.sleep(0.12)
        bar.advance()
    lines = stream.getvalue().split("\n")
    assert lines[0].startswith("\rsweep [") and "1/2" in lines[0]
    assert lines[1].startswith("\rsynth... 0s") and lines[1].split("\r")[-1].startswith("synth: done in 0 s")
    assert "2/2" in lines[2]


# ---- where files go ----------------------------------------------------------------------------------------
def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("WEFT_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir("rtl") == tmp_path / ".cache" / "weft" / "rtl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "weft"
    monkeypatch.setenv("WEFT_CACHE", str(tmp_path / "mine"))
    assert cache_dir("synth") == tmp_path / "mine" / "synth"
    from weft.hw.synth import default_cache
    from weft.sim.cosim import default_build_root

    assert default_cache() == tmp_path / "mine" / "synth" and default_build_root() == tmp_path / "mine"


def test_bitstream_projects_go_to_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bitstream", "--board", "pynq-z1", "--config", "tiny"]) == 0
    folder = tmp_path / "bitstreams" / f"pynq-z1-{PRESETS['tiny'].hash}"
    assert (folder / "build.tcl").exists()
    found = [f.resolve() for f, _ in bitstreams.find_bitstreams()]
    assert folder.resolve() in found  # ./bitstreams first ...
    assert any(f.parent == bitstreams.DEFAULT_ROOT.resolve() for f in found)  # ... then the shipped projects


def test_cosim_junit_report_has_a_case_per_seed():
    report = RandomReport(config="tiny", sim="verilator", timing="stress", wall_s=1.5, results=[
        SeedResult(seed=0, passed=True, cycles=10, counters={}, insn_count=3, macs=0),
        SeedResult(seed=1, passed=False, cycles=10, counters={}, insn_count=3, macs=0,
                   problem="DRAM byte 0x10: RTL 0x01, functional simulator 0x02\nmore"),
    ])
    suite = ET.fromstring(report.junit()).find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["seed 0", "seed 1"]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "DRAM byte 0x10: RTL 0x01, functional simulator 0x02"
