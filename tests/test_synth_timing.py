"""The critical path that `weft synth` reports: the static estimate over a synth_xilinx netlist and the
summary of nextpnr's report, on small hand-made inputs (no Yosys, no nextpnr)."""

from __future__ import annotations

import pytest

from weft.hw.synth import SynthError, critical_path, nextpnr_critical_path

LUT = {"I0": "input", "I1": "input", "O": "output"}
FF = {"C": "input", "CE": "input", "D": "input", "R": "input", "Q": "output"}
CARRY4 = {"CI": "input", "CYINIT": "input", "DI": "input", "S": "input", "O": "output", "CO": "output"}


def cell(kind: str, dirs: dict[str, str], **conns: list) -> dict:
    return {"type": kind, "port_directions": dirs, "parameters": {}, "connections": conns}


def netlist(cells: dict, names: dict[str, list[int]]) -> dict:
    return {"modules": {"top": {
        "ports": {"clk": {"direction": "input", "bits": [1]}},
        "cells": cells,
        "netnames": {name: {"hide_name": 0, "bits": bits} for name, bits in names.items()},
    }}}


def test_the_longest_register_to_register_path_counts_its_logic_levels():
    # a -> LUT -> LUT -> b is longer than a -> LUT -> c; a carry chain adds its CARRY4s at CI -> CO cost.
    cells = {
        "ra": cell("FDRE", FF, C=[1], CE=["1"], R=["0"], D=[10], Q=[2]),
        "l1": cell("LUT2", LUT, I0=[2], I1=[2], O=[3]),
        "l2": cell("LUT2", LUT, I0=[3], I1=[2], O=[4]),
        "rb": cell("FDRE", FF, C=[1], CE=["1"], R=["0"], D=[4], Q=[5]),
        "rc": cell("FDRE", FF, C=[1], CE=["1"], R=["0"], D=[3], Q=[6]),
        "rx": cell("FDRE", FF, C=[1], CE=["1"], R=["0"], D=[5], Q=[10]),
    }
    path = critical_path(netlist(cells, {"a": [2], "b": [5], "c": [6], "x": [10]}), "top")
    assert path["levels"] == 2 and path["from"] == "a" and path["to"] == "b"
    assert path["delay_ns"] == round(0.46 + 2 * (0.45 + 0.124) + 0.45 + 0.1, 2)
    assert path["fmax_mhz"] == pytest.approx(1000 / path["delay_ns"], abs=0.5)

    chain = dict(cells, k1=cell("CARRY4", CARRY4, CI=["0"], CYINIT=["0"], DI=[2, 2, 2, 2], S=[4, 4, 4, 4],
                                O=[20, 21, 22, 23], CO=[24, 25, 26, 27]),
                 k2=cell("CARRY4", CARRY4, CI=[27], CYINIT=["0"], DI=["0"] * 4, S=["0"] * 4,
                         O=[30, 31, 32, 33], CO=[34, 35, 36, 37]),
                 rd=cell("FDRE", FF, C=[1], CE=["1"], R=["0"], D=[37], Q=[38]))
    path = critical_path(netlist(chain, {"a": [2], "d": [38]}), "top")
    assert path["levels"] == 4 and path["to"] == "d"


def test_a_combinational_loop_is_an_error():
    cells = {"l1": cell("LUT2", LUT, I0=[3], I1=[3], O=[2]), "l2": cell("LUT2", LUT, I0=[2], I1=[2], O=[3])}
    with pytest.raises(SynthError, match="combinational loops"):
        critical_path(netlist(cells, {}), "top")


def test_nextpnr_s_slowest_path_is_summarized_by_the_signals_it_crosses():
    def seg(kind: str, delay: float, net: str = "") -> dict:
        return {"type": kind, "delay": delay, "net": net, "from": {"cell": f"{kind}_from"},
                "to": {"cell": f"{kind}_to"}}

    report = {"critical_paths": [
        {"path": [seg("clk-to-q", 0.5), seg("routing", 1.0, "core.fetch.word[3]"), seg("logic", 0.4),
                  seg("routing", 0.8, "core.fetch.word_LUT4_Z[1]"), seg("logic", 0.4),
                  seg("routing", 0.9, "$abc$123"), seg("setup", 0.1)]},
        {"path": [seg("clk-to-q", 0.5), seg("setup", 0.1)]},
    ]}
    path = nextpnr_critical_path(report)
    assert path["delay_ns"] == 4.1 and path["routing_ns"] == 2.7 and path["levels"] == 2
    assert path["signals"] == ["core.fetch.word"] and path["from"] == "clk-to-q_from"
    assert nextpnr_critical_path({}) == {}
