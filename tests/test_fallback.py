"""Fallback, never refusal: a layer the accelerator cannot take (an accumulator overflow, a back-end limit)
runs on the host within the same session, and ``weft inspect`` says where each layer runs and why."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import weft
from weft.cli import main
from weft.config import PRESETS
from weft.core.artifact import Artifact
from weft.core.epilogue import EpilogueOverflow
from weft.core.errors import CalibrationWarning
from weft.runtime import InferenceSession

from .test_frontend_util import cosine, make_model, ort_run, rand

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _conv(name: str, x: str, y: str, w: np.ndarray, b: np.ndarray, pads: int = 0) -> tuple[list, dict]:
    node = helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [y], pads=[pads] * 4, name=name)
    return [node], {f"{name}.w": w.astype(np.float32), f"{name}.b": b.astype(np.float32)}


def _he(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))


def _chain(first: tuple[np.ndarray, np.ndarray], x_shape: tuple[int, ...]) -> onnx.ModelProto:
    """input -> conv `first` -> Relu -> conv 3x3 (8 channels) -> Relu -> output."""
    rng = np.random.default_rng(1)
    w1, b1 = first
    nodes, inits = _conv("c1", "input", "t1", w1, b1)
    more, inits2 = _conv("c2", "r1", "t2", _he(rng, 8, w1.shape[0], 3, 3), rng.standard_normal(8) * 0.1, pads=1)
    nodes += [helper.make_node("Relu", ["t1"], ["r1"]), *more, helper.make_node("Relu", ["t2"], ["output"])]
    return make_model(nodes, {"input": x_shape}, {"output": None}, {**inits, **inits2})


def _bit_exact(art: Artifact, x: np.ndarray) -> np.ndarray:
    """The reference interpreter's output, after checking that fsim and cpu give the same bits."""
    ref = InferenceSession(art, device="ref").run(None, {"input": x})[0]
    for device in ("fsim", "cpu"):
        out = InferenceSession(art, device=device).run(None, {"input": x})[0]
        assert np.array_equal(out, ref), device
    return ref


def _node(art: Artifact, name: str):
    return next(n for n in art.graph.nodes if n.name == name)


def test_accumulator_overflow_stays_a_float_host_layer(tmp_path, capsys):
    # A bias that dwarfs the weights: in accumulator units (input scale x weight scale) it is ~1e10.
    rng = np.random.default_rng(0)
    model = _chain((_he(rng, 8, 4, 3, 3) * 1e-5, np.full(8, 50.0)), (1, 4, 12, 12))
    cal = {"input": rand(4, 1, 4, 12, 12)}
    art = weft.compile(model, config="tiny", calibration=cal)
    over = _node(art, "c1")
    assert over.op == "FusedConv" and over.attrs["target"] == "host"
    assert "beyond the 32-bit accumulator" in over.attrs["host_reason"]
    assert _node(art, "c2").attrs["target"] == "accel"
    x = rand(1, 4, 12, 12, seed=3)
    out = _bit_exact(art, x)
    assert cosine(out, ort_run(model, {"input": x})[0]) >= 0.99
    onnx.save(model, tmp_path / "over.onnx")
    assert main(["compile", str(tmp_path / "over.onnx"), "--config", "tiny"]) == 0
    assert "1 layer(s) fell back to the host (c1: calibrated accumulator values reach" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "over.weft")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "host: calibrated accumulator values reach" in next(s for s in lines if " c1 " in s)
    assert "1 layer(s) on the host for an accelerator limit" in lines[-1]


def test_no_requantization_that_fits_keeps_the_layer_float(monkeypatch):
    def overflow(**_: object) -> None:
        raise EpilogueOverflow("no shift fits")

    monkeypatch.setattr("weft.compiler.quantize.build_epilogue", overflow)
    rng = np.random.default_rng(0)
    model = _chain((_he(rng, 8, 4, 3, 3), np.zeros(8)), (1, 4, 12, 12))
    art = weft.compile(model, config="tiny", calibration={"input": rand(2, 1, 4, 12, 12)})
    for name in ("c1", "c2"):
        node = _node(art, name)
        assert node.op == "FusedConv" and node.attrs["target"] == "host"
        assert node.attrs["host_reason"] == "no requantization fits the 32-bit accumulator (no shift fits)"
    # All float: fsim runs the host layers with the reference's kernels; LLVM's float differs in the last bits.
    x = rand(1, 4, 12, 12, seed=3)
    ref, fsim, cpu = (InferenceSession(art, device=d).run(None, {"input": x})[0] for d in ("ref", "fsim", "cpu"))
    assert np.array_equal(fsim, ref) and np.allclose(cpu, ref, rtol=1e-5, atol=1e-5)
    assert cosine(ref, ort_run(model, {"input": x})[0]) >= 0.999


def test_back_end_limit_runs_the_int8_layer_on_the_host(tmp_path, capsys):
    # A 1x80 kernel needs 80 weight rows for one tile; tiny's weight buffer has 64.
    rng = np.random.default_rng(2)
    model = _chain((_he(rng, 4, 4, 1, 80), rng.standard_normal(4) * 0.1), (1, 4, 4, 96))
    art = weft.compile(model, config="tiny", calibration={"input": rand(4, 1, 4, 4, 96)})
    wide = _node(art, "c1")
    assert wide.op == "qconv2d" and wide.attrs["target"] == "host"
    assert "no tiling fits the buffers" in wide.attrs["host_reason"]
    assert art.graph.meta["fallbacks"] == {"c1": wide.attrs["host_reason"]}
    assert _node(art, "c2").attrs["target"] == "accel"
    x = rand(1, 4, 4, 96, seed=5)
    out = _bit_exact(art, x)
    assert cosine(out, ort_run(model, {"input": x})[0]) >= 0.99
    with pytest.raises(ValueError, match=r"'c1', which runs on the host: .*no tiling fits"):
        weft.compile(model, config="tiny", calibration={"input": rand(4, 1, 4, 4, 96)}, schedules={"c1": {}})
    path = art.save(tmp_path / "wide.weft")
    assert main(["inspect", str(path), "--json"]) == 0
    layers = {r["name"]: r for r in json.loads(capsys.readouterr().out)["layers"]}
    assert layers["c1"]["target"] == "host" and "no tiling fits" in layers["c1"]["host_reason"]
    assert layers["c2"]["host_reason"] is None
    assert main(["report", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-1] == "why" and "no tiling fits" in next(s for s in table if s.startswith("c1 "))


def test_code_generation_sends_a_layer_it_cannot_lower_to_the_host(monkeypatch):
    # With an admission check that takes everything, the 1x80 conv reaches code generation, which fails to
    # lower it and hands it to the host instead of failing the compile.
    monkeypatch.setattr("weft.compiler.backend.admit.check_layer", lambda node, graph, config: None)
    rng = np.random.default_rng(2)
    model = _chain((_he(rng, 4, 4, 1, 80), rng.standard_normal(4) * 0.1), (1, 4, 4, 96))
    art = weft.compile(model, config="tiny", calibration={"input": rand(4, 1, 4, 4, 96)})
    wide = _node(art, "c1")
    assert wide.attrs["target"] == "host" and "no tiling fits the buffers" in wide.attrs["host_reason"]
    assert set(art.graph.meta["fallbacks"]) == {"c1"}
    assert [s["target"] for s in art.graph.meta["partition"]] == ["host", "accel", "host"]
    assert [layer["name"] for layer in art.sections["accel"].meta["layers"]] == ["c2"]
    _bit_exact(art, rand(1, 4, 4, 96, seed=5))


def test_row_orders_the_relayout_cannot_convert_send_layers_to_the_host():
    # rect with block_in 16: a tile holds 4 out rows per batch of 2, which the identity relayout cannot
    # regroup into inp rows (weft.core.layout.row_order_refusal); rect itself runs on the accelerator.
    rng = np.random.default_rng(3)
    model = _chain((_he(rng, 8, 4, 3, 3), rng.standard_normal(8) * 0.1), (2, 4, 8, 8))
    art = weft.compile(model, config=PRESETS["rect"].replace(block_in=16), calibration={"input": rand(2, 2, 4, 8, 8)})
    convs = [n for n in art.graph.nodes if n.op == "qconv2d"]
    assert convs and all(n.attrs["target"] == "host" and "batch=4" in n.attrs["host_reason"] for n in convs)
    _bit_exact(art, rand(2, 4, 8, 8, seed=6))
    rect = weft.compile(model, config="rect", calibration={"input": rand(2, 2, 4, 8, 8)})
    assert all(n.attrs["target"] == "accel" for n in rect.graph.nodes if n.op == "qconv2d")
    _bit_exact(rect, rand(2, 4, 8, 8, seed=6))


def test_inspect_says_where_and_why(tmp_path, capsys):
    rng = np.random.default_rng(4)
    nodes, inits = _conv("c1", "input", "t1", _he(rng, 8, 4, 3, 3), np.zeros(8))
    nodes += [helper.make_node("Flatten", ["t1"], ["f"]), helper.make_node("Softmax", ["f"], ["output"])]
    model = make_model(nodes, {"input": (1, 4, 6, 6)}, {"output": None}, inits)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["compile", str(path), "--config", "tiny", "-o", str(tmp_path / "m.weft")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "m.weft")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(k for k, s in enumerate(lines) if s.split()[-1:] == ["why"])
    rows = lines[head + 1:]
    why = {s.split()[1]: s for s in rows if len(s.split()) > 2 and not s.startswith("total")}
    assert why["c1"].endswith("accel")
    assert next(s for s in why.values() if " Softmax " in s).endswith("host: Softmax has no integer form")
    assert any(s.endswith("host: float/int8 boundary") for s in why.values())


def _randomized(path: Path) -> onnx.ModelProto:
    """A light model with its ConstantOfShape weight placeholders replaced by random initializers:
    He-normal conv weights, small biases and shifts, BatchNormalization scales ~1 and variances > 0."""
    model = onnx.load(path)
    g = model.graph
    shapes = {i.name: tuple(int(d) for d in numpy_helper.to_array(i)) for i in g.initializer}
    users = {x: (n.op_type, k) for n in g.node for k, x in enumerate(n.input)}
    rng = np.random.default_rng(0)
    keep = []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in shapes:
            keep.append(n)
            continue
        shape = shapes[n.input[0]]
        use = users.get(n.output[0], ("", 0))
        if use in (("Conv", 1), ("Gemm", 1)):
            a = _he(rng, *shape)
        elif use == ("BatchNormalization", 4):
            a = rng.uniform(0.5, 1.5, shape)
        elif use == ("BatchNormalization", 1):
            a = rng.uniform(0.8, 1.2, shape)
        else:
            a = rng.standard_normal(shape) * 0.05
        g.initializer.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    return model


@pytest.mark.slow
def test_densenet121_compiles_with_its_overflowing_layers_on_the_host(tmp_path, capsys):
    model = _randomized(LIGHT / "light_densenet121.onnx")
    started = time.perf_counter()
    with pytest.warns(CalibrationWarning):
        art = weft.compile(model, config="tiny")
    seconds = time.perf_counter() - started
    over = [n for n in art.graph.nodes if n.op == "FusedConv"]
    assert over and all("accumulator" in n.attrs["host_reason"] and n.attrs["target"] == "host" for n in over)
    assert set(art.graph.meta["fallbacks"]) == {n.name for n in over}
    assert sum(n.attrs["target"] == "accel" for n in art.graph.nodes if n.op == "qconv2d") > 100
    path = art.save(tmp_path / "densenet.weft")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for n in over:
        assert next(s for s in out.splitlines() if f" {n.name} " in s).rstrip().endswith("accumulator")
    print(f"densenet121 on tiny: compiled in {seconds:.0f} s, {len(over)} float host layers")


def test_only_an_op_weft_does_not_know_fails_the_compile(tmp_path, capsys):
    model = make_model([helper.make_node("Foo", ["input"], ["output"], name="N")], {"input": (1, 4)},
                       {"output": (1, 4)})
    onnx.save(model, tmp_path / "foo.onnx")
    assert main(["compile", str(tmp_path / "foo.onnx")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("weft compile: error: node 'N' (Foo): op 'Foo' is not supported (weft imports: ")
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err
    assert not (tmp_path / "foo.weft").exists()
