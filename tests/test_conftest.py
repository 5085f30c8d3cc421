"""The `rtl` marker's simulator skip (tests/conftest.py), decided with a fake `which`."""

from __future__ import annotations

import pytest

from .conftest import missing_simulators

RTL = pytest.mark.rtl.mark
ICARUS = pytest.mark.rtl("icarus").mark
BOTH = pytest.mark.rtl("verilator", "icarus").mark


def _which(*installed: str):
    return lambda tool: f"/usr/bin/{tool}" if tool in installed else None


@pytest.mark.parametrize(("marks", "installed", "missing"), [
    ([], (), []),                                      # not an rtl test: never skipped
    ([pytest.mark.slow.mark], (), []),
    ([RTL], ("verilator", "iverilog"), []),
    ([RTL], ("iverilog",), ["verilator"]),             # a bare mark needs Verilator
    ([RTL], ("verilator",), []),
    ([ICARUS], ("verilator",), ["iverilog"]),
    ([ICARUS], ("iverilog",), []),
    ([RTL, ICARUS], ("iverilog",), []),                # a module-wide bare mark and an Icarus parameter
    ([BOTH], ("verilator",), ["iverilog"]),
    ([BOTH], (), ["verilator", "iverilog"]),
    ([RTL, BOTH], ("verilator", "iverilog"), []),
])
def test_rtl_marks_name_the_simulators_a_test_needs(marks, installed, missing):
    assert missing_simulators(marks, which=_which(*installed)) == missing


def test_an_unknown_simulator_in_an_rtl_mark_is_refused():
    with pytest.raises(ValueError, match="modelsim"):
        missing_simulators([pytest.mark.rtl("modelsim").mark], which=_which())
