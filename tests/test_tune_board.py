"""The board measurer and `weft tune --measure board` on the pynq stand-in (tests/fake_pynq): the board's
exact code path (pynq.Overlay, pynq.allocate, MMIO, the driver) with the functional simulator's register
model behind it (cycles from the timing model), and in a slow test the RTL simulation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from weft.compiler.backend.codegen import BackendError
from weft.compiler.models import small_resnet
from weft.compiler.tune import TuningLog, tune_layer
from weft.compiler.tune.measure import RtlMeasurer, TimingMeasurer, lower
from weft.compiler.tune.space import SearchSpace
from weft.config import PRESETS
from weft.hw.regs import ErrorCode, register_map
from weft.runtime import bitstreams
from weft.runtime.devices import DeviceError
from weft.runtime.safety import LaunchError
from weft.tools.board_measurer import BoardMeasurer, BoardTimeout

from .tune_util import accel_layers

STANDIN = Path(__file__).parent / "fake_pynq"


@pytest.fixture(scope="module")
def setup():
    cfg, accel = accel_layers()
    # The two smallest layers (a 1x1 conv and an average pool) keep the functional simulator fast.
    layers = {x.geom.name: x for x in accel}
    return cfg, layers["logits"], layers["avgpool"]


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.delitem(sys.modules, "pynq", raising=False)
    monkeypatch.setenv("WEFT_PYNQ_BACKEND", "fsim")
    monkeypatch.setenv("WEFT_PYNQ_DRAM_BYTES", str(1 << 20))
    return monkeypatch


def _bitstream(tmp_path: Path, config) -> Path:
    """A board project whose manifest names `config`; the stand-in's Overlay starts that accelerator."""
    folder = bitstreams.write_project("pynq-z2", config, tmp_path, verilog="// the stand-in does not read it")
    (folder / "weft.bit").write_bytes(b"stand-in bitstream for " + config.hash.encode())
    (folder / "weft.hwh").write_text("<hwh/>")
    bitstreams.record_build(folder)
    return folder / "weft.bit"


def _lowering(layer, cfg, count: int) -> list:
    """The first `count` schedules of the layer's space that lower."""
    out = []
    for s in SearchSpace(layer.geom, cfg).points:
        try:
            lower(layer, s, cfg)
        except BackendError:
            continue
        out.append(s)
        if len(out) == count:
            break
    assert len(out) == count
    return out


def test_board_cycles_equal_the_timing_model(setup, standin, tmp_path):
    """The register model's counter is the timing model's figure for the relocated program; the buffer
    sits 4 KiB aligned above 0, so every DMA splits at the same boundaries and the counts agree exactly."""
    cfg, logits, avgpool = setup
    timing = TimingMeasurer(cfg)
    with BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg)) as board:
        overlay = board.device.hardware.overlay
        backend = overlay.backend
        for layer in (logits, avgpool):
            for s in _lowering(layer, cfg, 3):
                assert board.measure(layer, s) == timing.measure(layer, s)
        # One overlay and one buffer for every measurement: no second download, no allocation per schedule.
        assert board.device.hardware.overlay is overlay and overlay.backend is backend
        assert len(board.device.hardware.buffers) == 1
        assert board.driver.buffer.physical_address > 0


def test_repeat_keeps_the_fewest_cycles_and_tunes(setup, standin, tmp_path):
    cfg, logits, _ = setup
    s = _lowering(logits, cfg, 1)[0]
    with BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg), repeat=3) as board:
        runs = []
        original = board.driver.run_image

        def counted(*args):
            result = original(*args)
            runs.append(result["counters"]["cycles"])
            return result

        board.driver.run_image = counted
        assert board.measure(logits, s) == min(runs) == TimingMeasurer(cfg).measure(logits, s)
        assert len(runs) == 3
        board.driver.run_image = original
        r = tune_layer(logits, cfg, board, trials=4, tuner="random", log=TuningLog(), seed=0)
    assert r.best_cycles is not None and all(c is not None for c in r.history)
    with pytest.raises(ValueError, match="repeat must be at least 1, got 0"):
        BoardMeasurer(cfg, bitstream="unused.bit", repeat=0)


def test_board_refuses_a_bitstream_of_another_config(setup, standin, tmp_path):
    cfg = setup[0]
    other = PRESETS["default"]
    with pytest.raises(LaunchError, match=f"config hash mismatch.*{cfg.hash}.*{other.hash}"):
        BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, other))


def test_board_refuses_hardware_reporting_another_hash(setup, standin, tmp_path, monkeypatch):
    """The manifest agrees but the loaded accelerator's CONFIG_HASH registers do not (a stale download)."""
    cfg = setup[0]
    from weft.runtime.register_backend import FsimBackend

    real = FsimBackend.read_reg
    hash_lo = next(r.offset for r in register_map(cfg) if r.name == "CONFIG_HASH_LO")
    monkeypatch.setattr(FsimBackend, "read_reg", lambda self, off: real(self, off) ^ (1 if off == hash_lo else 0))
    with pytest.raises(LaunchError, match="config hash mismatch"):
        BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg))


def test_board_reports_an_injected_error_code(setup, standin, tmp_path):
    cfg, logits, _ = setup
    s = _lowering(logits, cfg, 1)[0]
    with BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg)) as board:
        backend = board.device.hardware.overlay.backend

        def fail() -> None:  # the hardware ends the run with an error, as its checker would
            backend.values.update(done=1, error=1, error_code=int(ErrorCode.SRAM_RANGE), error_index=2)

        board.driver.on_start = fail
        with pytest.raises(ValueError, match=r"layer 'logits' under .*error SRAM_RANGE at instruction 2 \(") as info:
            board.measure(logits, s)
        assert str(s) in str(info.value)
        board.driver.on_start = None
        assert board.measure(logits, s) == TimingMeasurer(cfg).measure(logits, s)


def test_board_timeout_names_the_stuck_unit_and_recovers(setup, standin, tmp_path):
    cfg, logits, _ = setup
    s = _lowering(logits, cfg, 1)[0]
    with BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg), timeout_s=0.2) as board:
        overlay = board.device.hardware.overlay
        stuck = overlay.backend

        def hang() -> None:  # never done; the compute unit's stall counter moves while time passes
            stuck.values.update(done=0, busy=1)
            stuck.wait_irq = lambda cycles: stuck.values.update(stall_compute=stuck.values["stall_compute"] + cycles)

        board.driver.on_start = hang
        with pytest.raises(BoardTimeout, match=r"layer 'logits' under .*watchdog.*compute unit stalled") as info:
            board.measure(logits, s)
        assert info.value.report["stuck"][0]["unit"] == "compute"
        # The driver downloaded the bitstream again: a fresh accelerator, checked, measures again.
        assert overlay.backend is not stuck
        board.driver.on_start = None
        assert board.measure(logits, s) == TimingMeasurer(cfg).measure(logits, s)


def test_tune_command_measures_on_the_board(setup, standin, tmp_path, capsys):
    from weft.cli import main

    cfg, logits, _ = setup
    model = tmp_path / "m.onnx"
    model.write_bytes(small_resnet().SerializeToString())
    bit = _bitstream(tmp_path, cfg)
    log = tmp_path / "t.jsonl"
    base = ["tune", str(model), "--config", "tiny", "--trials", "3", "--tuner", "random", "--layers", "logits",
            "-o", str(log), "--measure", "board"]
    assert main([*base, "--device-option", f"bitstream={bit}", "--device-option", "timeout_s=30"]) == 0
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(records) == 3 and {r["measurer"] for r in records} == {"board"}
    timing = TimingMeasurer(cfg)
    for r in records:
        s = next(p for p in SearchSpace(logits.geom, cfg).points if p.to_dict() == r["schedule"])
        assert r["cycles"] == timing.measure(logits, s)
    capsys.readouterr()
    # Refusals name the culprit.
    assert main([*base, "--device-option", f"bitstream={bit}", "--device-option", "colour=red"]) == 2
    assert "has no option 'colour'" in capsys.readouterr().err
    assert main(base) == 2
    assert "--measure board needs the bitstream: --device-option bitstream=PATH" in capsys.readouterr().err
    assert main([*base[:-1], "timing", "--device-option", f"bitstream={bit}"]) == 2
    assert "--device-option and --repeat are for --measure board" in capsys.readouterr().err


def test_device_options_are_refused_before_the_board_opens(setup, standin):
    with pytest.raises(DeviceError, match="device 'pynq' has no option 'colour'"):
        BoardMeasurer(setup[0], bitstream="unused.bit", colour="red")
    with pytest.raises(ValueError, match="needs the bitstream"):
        BoardMeasurer(setup[0])


def test_board_measurer_without_pynq_says_so(setup, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", None)  # import pynq fails as where it is not installed
    with pytest.raises(ValueError, match=r"runs on a PYNQ board .*tests/fake_pynq on PYTHONPATH"):
        BoardMeasurer(setup[0], bitstream=_bitstream(tmp_path, setup[0]))


@pytest.mark.slow
@pytest.mark.rtl
def test_board_cycles_equal_the_rtl_measurer(setup, standin, tmp_path):
    """The stand-in backed by the RTL simulation: the board's counter equals the RtlMeasurer's, run after run
    on one simulation, the program relocated to the buffer's address.

    Both answer DRAM with the same model, but its bandwidth limit (the Pynq preset's 3 beats in 4 cycles)
    is a pattern that runs freely from the simulation's start, and a program's cycles depend on its phase
    at START by a cycle or two (4745 or 4747 for one schedule of 'logits'). The cosimulation starts every
    job on a fresh simulation, so always in one phase; the board path starts wherever the previous run
    and the polling left it, as a board's DRAM controller does (hence ``repeat``). With the ideal DRAM
    (the Pynq preset's bandwidth pattern off) nothing depends on history and the counts agree exactly."""
    from weft.runtime import rtl_device

    real = rtl_device.RtlBackend
    standin.setattr(rtl_device, "RtlBackend", lambda config, size, **kw: real(config, size, timing="ideal", **kw))
    standin.setenv("WEFT_PYNQ_BACKEND", "rtl")
    cfg, logits, avgpool = setup
    rtl = RtlMeasurer(cfg, timing="ideal")
    runs = [(logits, _lowering(logits, cfg, 1)[0]), (avgpool, _lowering(avgpool, cfg, 1)[0])]
    with BoardMeasurer(cfg, bitstream=_bitstream(tmp_path, cfg)) as board:
        expected = [rtl.measure(layer, s) for layer, s in runs]
        assert [board.measure(layer, s) for layer, s in runs * 2] == expected * 2
