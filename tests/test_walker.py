"""The one graph walker and the one host dispatcher every device runs: the same outputs and per-layer
records on ref and fsim for a graph whose host layers sit between accelerator layers, one error for a host
op without a kernel, and devices made by composition (none inherits from another)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import numpy as np
import pytest

import weft
from weft.core import walker
from weft.core.host import NoKernelError
from weft.core.reference import run_reference
from weft.runtime.cpu_device import CpuDevice
from weft.runtime.devices import Device, RefDevice
from weft.runtime.driver import DriverDevice
from weft.runtime.fsim_device import FsimDevice
from weft.runtime.pynq_device import PynqDevice
from weft.runtime.register_backend import FIRST_ADDRESS, fsim_hardware
from weft.runtime.remote import RemoteDevice
from weft.runtime.rtl_device import RtlDevice

from .driver_util import compiled

RUNTIME = Path(weft.runtime.__file__).parent
COMMON = ("name", "op", "target", "macs", "shape")


def _driver_device(art):
    size = FIRST_ADDRESS + art.sections["accel"].meta["dram_bytes"]
    return DriverDevice(art.config, fsim_hardware(art.config, size))


def test_host_layers_between_accel_layers_run_alike_on_ref_and_fsim():
    art, feeds = compiled("awkward_cnn")
    targets = [n.attrs["target"] for n in art.graph.nodes]
    first, last = targets.index("accel"), len(targets) - 1 - targets[::-1].index("accel")
    assert "host" in targets[first:last]  # host layers sit between accelerator layers
    ref = weft.InferenceSession(art, device="ref")
    fsim = weft.InferenceSession(art, device="fsim")
    for r, f in zip(ref.run(None, feeds, keep_intermediates=True), fsim.run(None, feeds, keep_intermediates=True),
                    strict=True):
        np.testing.assert_array_equal(r, f)
    for node in art.graph.nodes:
        for name in node.outputs:
            np.testing.assert_array_equal(ref.intermediate(name), fsim.intermediate(name), err_msg=name)
    ref_layers, fsim_layers = ref.stats["layers"], fsim.stats["layers"]
    assert [{k: x[k] for k in COMMON} for x in ref_layers] == [{k: x[k] for k in COMMON} for x in fsim_layers]
    assert all(set(x) == {*COMMON, "seconds"} for x in ref_layers)
    for layer in fsim_layers:
        assert list(layer)[:5] == list(COMMON) and list(layer)[-1] == "seconds"
        if layer["target"] == "host":
            assert (layer["insn_count"], layer["bytes"], layer["cycles"]) == (0, {}, None)
        else:
            assert layer["insn_count"] > 0 and "schedule" in layer
    accel_cycles = [x["cycles"] for x in fsim_layers if x["target"] == "accel"]
    assert fsim.stats["cycles"] == (None if None in accel_cycles else sum(accel_cycles))
    assert ref.stats["cycles"] is None


def test_values_move_between_host_and_dram_only_when_needed():
    """Each value is packed into DRAM at most once and read back at most once per run."""
    art, feeds = compiled("awkward_cnn")
    device = FsimDevice(art.config)
    device.load(art)
    runner = device.runner
    moves: list[tuple[str, str]] = []
    write, read = runner.write_value, runner.read_value
    runner.write_value = lambda name, array: (moves.append(("write", name)), write(name, array))[1]
    runner.read_value = lambda name: (moves.append(("read", name)), read(name))[1]
    device.run(feeds)
    concat = next(n for n in art.graph.nodes if n.name == "concat").outputs[0]
    assert len(moves) == len(set(moves))
    assert ("write", art.graph.inputs[0]) not in moves  # quantized on the host first
    assert ("read", concat) not in moves and ("write", concat) in moves  # a host layer's output
    assert ("read", art.graph.nodes[-1].inputs[0]) in moves  # the last accelerator layer's output


def _with_bogus_op(art):
    bad = copy.deepcopy(art)
    node = next(n for n in bad.graph.nodes if n.op == "AveragePool")
    node.op = "Bogus"
    return bad, node.name


@pytest.mark.parametrize("device", ["ref", "fsim", "driver"])
def test_host_op_without_kernel_is_one_clear_error(device):
    art, feeds = compiled("awkward_cnn")
    bad, name = _with_bogus_op(art)
    dev = _driver_device(bad) if device == "driver" else device
    sess = weft.InferenceSession(bad, device=dev)
    with pytest.raises(NoKernelError, match=rf"node '{name}' \(Bogus\): no host kernel for this op"):
        sess.run(None, feeds)
    with pytest.raises(NoKernelError, match=rf"node '{name}' \(Bogus\)"):
        run_reference(bad.graph, feeds)


def test_every_device_dispatches_host_layers_through_the_one_dispatcher(monkeypatch):
    art, feeds = compiled("awkward_cnn")
    seen: list[str] = []
    dispatch = walker.run_host_node

    def spy(node, *args):
        seen.append(node.name)
        return dispatch(node, *args)

    monkeypatch.setattr(walker, "run_host_node", spy)
    host = [n.name for n in art.graph.nodes if n.attrs["target"] == "host"]
    for device in ("fsim", _driver_device(art)):
        seen.clear()
        weft.InferenceSession(art, device=device).run(None, feeds)
        assert seen == host
    seen.clear()
    weft.InferenceSession(art, device="ref").run(None, feeds)
    assert seen == [n.name for n in art.graph.nodes]  # ref runs the accelerator layers' kernels too
    # and nothing else in the runtime looks the kernels up
    users = sorted(p.name for p in RUNTIME.glob("*.py")
                   if p.name not in ("host.py", "qkernels.py") and ("QKERNELS" in p.read_text()
                                                                     or "FLOAT_OPS" in p.read_text()))
    assert users == []


def test_device_classes_compose_instead_of_inheriting():
    devices = [RefDevice, FsimDevice, DriverDevice, RtlDevice, PynqDevice, CpuDevice, RemoteDevice]
    assert all(issubclass(d, Device) for d in devices)
    for a, b in itertools.permutations(devices, 2):
        assert not issubclass(a, b), (a.__name__, b.__name__)


def test_driver_device_calls_on_layer_around_each_program():
    art, feeds = compiled("mlp")
    calls: list[tuple[str, str]] = []
    device = _driver_device(art)
    device.on_layer = lambda layer, dram, when: calls.append((layer["name"], when))
    sess = weft.InferenceSession(art, device=device)
    sess.run(None, feeds)
    accel = [layer["name"] for layer in sess.stats["layers"] if layer["target"] == "accel"]
    assert calls == [(name, when) for name in accel for when in ("before", "after")]


def test_rtl_device_code_path_on_the_fsim_register_model(monkeypatch):
    """The rtl device's walk, driver runner and cycle bookkeeping, with the simulation swapped for the
    functional simulator's register model (no Verilog simulator needed)."""
    from weft.runtime import rtl_device

    art, feeds = compiled("awkward_cnn")
    monkeypatch.setattr(rtl_device, "rtl_hardware",
                        lambda config, nbytes, **options: fsim_hardware(config, FIRST_ADDRESS + nbytes))
    sess = weft.InferenceSession(art, device="rtl")
    after: list[str] = []
    sess.device.on_layer = lambda layer, dram, when: after.append(layer["name"]) if when == "after" else None
    try:
        out = sess.run(None, feeds)
    finally:
        sess.device.close()
    for r, d in zip(weft.InferenceSession(art, device="ref").run(None, feeds), out, strict=True):
        np.testing.assert_array_equal(r, d)
    accel = [layer for layer in sess.stats["layers"] if layer["target"] == "accel"]
    assert after == [layer["name"] for layer in accel]
    assert [sess.device.layer_cycles(layer) for layer in accel] == [layer["cycles"] for layer in accel]
    assert sess.stats["device"] == "rtl" and sess.stats["cycles"] == sum(layer["cycles"] for layer in accel)
