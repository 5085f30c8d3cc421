"""The `weft` command: config, isa, asm, error exits."""

from __future__ import annotations

import json

import numpy as np

from weft.cli import main
from weft.config import PRESETS
from weft.isa import assemble, decode_insns

from .test_config import VTA_DEFAULT


def test_config_prints_resolved_json(capsys, tmp_path):
    assert main(["config", "--config", "tiny"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hash"] == PRESETS["tiny"].hash
    assert data["derived"]["rows"]["acc"] == 256
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(VTA_DEFAULT))
    assert main(["config", "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["hash"] == PRESETS["default"].hash


def test_isa_formats(capsys, tmp_path):
    assert main(["isa", "--config", "zcu104", "--format", "json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["config_hash"] == PRESETS["zcu104"].hash
    out = tmp_path / "spec.h"
    assert main(["isa", "--format", "c", "-o", str(out)]) == 0
    assert "WEFT_OPCODE_GEMM 2" in out.read_text()
    assert main(["isa", "--format", "md"]) == 0
    assert "## GEMM" in capsys.readouterr().out


def test_asm_round_trip(tmp_path, capsys):
    src = tmp_path / "p.s"
    src.write_text("LOAD inp sram=0 dram=4 y=2 x=3 stride=5 pad=1,0,0,1 deps=push_next\nFINISH\n")
    binary = tmp_path / "p.bin"
    assert main(["asm", str(src), "-o", str(binary)]) == 0
    assert np.array_equal(decode_insns(PRESETS["default"], binary.read_bytes()), assemble(src.read_text()))
    assert main(["asm", "-d", str(binary)]) == 0
    assert capsys.readouterr().out == (
        "LOAD inp sram=0 dram=4 y=2 x=3 stride=5 pad=1,0,0,1 deps=push_next\nFINISH\n"
    )


def test_errors_exit_non_zero_with_one_line(capsys, tmp_path):
    assert main(["config", "--config", "missing-preset"]) == 2
    err = capsys.readouterr().err
    assert "missing-preset" in err and "Traceback" not in err
    bad = tmp_path / "bad.s"
    bad.write_text("FINISH\nLOAD inp sram=0 dram=0 y=1 x=1 pad=99,0,0,0\n")
    assert main(["asm", str(bad)]) == 2
    assert "instruction 1: field 'y_pad_0'" in capsys.readouterr().err


def test_demo_runs_bit_exact_on_every_preset(capsys):
    """The demo (ResNet-18 by default) on a small model, rect's batch 2 with unequal GEMM blocks included."""
    for name in PRESETS:
        assert main(["demo", "--config", name, "--model", "small_resnet"]) == 0
        out = capsys.readouterr().out
        assert "bit-exact" in out and "roofline bound" in out


def test_bench_fsim_reports_speed(capsys):
    assert main(["bench", "fsim", "--config", "tiny", "--repeat", "1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["macs_per_s"] > 0 and figures["macs"] > 0


def test_bench_refuses_an_option_the_benchmark_does_not_take(capsys):
    from weft.cli import main

    assert main(["bench", "fsim", "--trials", "3"]) == 2
    assert "benchmark 'fsim' takes no --trials option" in capsys.readouterr().err


def test_a_reader_that_stops_early_is_not_an_error():
    """`weft config | head`: the reader closes the pipe before weft writes; no error line, exit 0."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "weft.cli", "config", "--config", "default"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before weft has imported anything
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0
    assert err == ""
