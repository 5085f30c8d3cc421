"""`weft bench cpu` on a model file: any .onnx runs, the figures name the machine and each slow layer's
share of the measured peak; a bad model is refused naming it. Figures are not judged here (speed lives in
the benchmark's output, not in unit tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weft.compiler import models
from weft.core.errors import ModelError
from weft.errors import UsageError
from weft.tools.bench_cpu import _random_inputs, bench_cpu


def test_an_onnx_file_runs_and_the_figures_name_the_machine(tmp_path: Path) -> None:
    path = models.save(models.MODELS["mlp"](), tmp_path / "mlp.onnx")
    figures = bench_cpu("default", model=str(path), repeat=1, threads=1)
    assert figures["model"] == str(path)
    assert figures["max_rel_err_vs_onnxruntime"] <= 1e-4
    machine = figures["machine"]
    assert machine["peak_gflops"] > 0 and machine["vector_bits"] in (64, 128, 256, 512) and machine["cpu"]
    assert figures["slowest_layers"], "the mlp has dense layers"
    for layer in figures["slowest_layers"]:
        assert layer["fraction_of_peak"] == pytest.approx(layer["gflops"] / machine["peak_gflops"])


def test_an_unknown_model_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match=r"'nosuchnet'.*resnet18"):
        bench_cpu("default", model="nosuchnet", repeat=1, threads=1)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"missing\.onnx: no such model file"):
        bench_cpu("default", model=str(tmp_path / "missing.onnx"), repeat=1, threads=1)


def _relu_model(dims: list[int | str]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    return helper.make_model(graph)


def test_a_symbolic_batch_becomes_one_and_other_symbols_are_refused() -> None:
    assert _random_inputs(_relu_model(["N", 4]), 0)["x"].shape == (1, 4)
    with pytest.raises(UsageError, match="graph input 'x' has symbolic dimensions \\[1\\]"):
        _random_inputs(_relu_model([1, "K"]), 0)
