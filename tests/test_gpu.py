"""The loop IR on NVIDIA GPUs: PTX for an element-wise kernel, a cross-thread reduction and a tiled matmul
(and every kernel of whole models), validated by ``ptxas`` where the CUDA toolkit is installed; the GPU
lowering (thread bindings, shared-memory caches, barriers, guards) checked against numpy by interpreting
it thread by thread; execution through the CUDA driver API when a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import weft
from weft.compiler import models
from weft.compiler.llvm import gpu
from weft.compiler.llvm.cuda import GpuKernel, cuda_available, find_ptxas, gpu_steps, ptx, ptxas
from weft.compiler.llvm.interp import InterpreterError, interpret, interpret_plan
from weft.compiler.llvm.te import Kernel, compute
from weft.runtime import DeviceError, InferenceSession

from .test_frontend_util import make_model, ort_run, rand

GPU, GPU_WHY = cuda_available()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no CUDA GPU to execute on: {GPU_WHY}")
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")


def _cases():
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    rows = rng.standard_normal((37, 1000)).astype(np.float32)
    a, bm = rng.standard_normal((70, 45)).astype(np.float32), rng.standard_normal((45, 83)).astype(np.float32)
    return [
        ("elementwise", gpu.elementwise_kernel(1000), {"x": x, "b": b}, "y", np.maximum(x * 2 + b, 0) * np.exp(-x)),
        ("reduction", gpu.row_sum_kernel(37, 1000), {"x": rows}, "y", rows.sum(axis=1)),
        ("matmul", gpu.matmul_kernel(70, 83, 45, tile=(32, 32, 8), per_thread=(2, 2)), {"a": a, "b": bm}, "c", a @ bm),
    ]


@needs_ptxas
@pytest.mark.parametrize("case", range(3), ids=["elementwise", "reduction", "matmul"])
def test_ptx_is_accepted_by_ptxas(case):
    name, kernel, *_ = _cases()[case]
    text, (launches,) = ptx([kernel])
    assert ".entry" in text and ".target sm_80" in text
    report = ptxas(text)
    assert set(report) == {launch.name for launch in launches}
    if name != "elementwise":  # the reduction tree and the staged tiles live in shared memory
        assert all(v["shared_bytes"] == launch.shared_bytes > 0 for v, launch in zip(report.values(), launches,
                                                                                   strict=True))
    if name == "matmul":
        assert "bar.sync" in text and launches[0].block == (16, 16, 1) and launches[0].grid == (3, 3, 1)


@pytest.mark.parametrize("case", range(3), ids=["elementwise", "reduction", "matmul"])
def test_gpu_lowering_computes_the_definition(case):
    """Blocks and threads interpreted in lockstep between barriers: non-dividing tiles, guarded copies."""
    inputs = _cases()[case][2]
    small = {"elementwise": gpu.elementwise_kernel(300), "reduction": gpu.row_sum_kernel(5, 300, threads=32)}
    if case == 0:
        x = inputs["x"][:300]
        got = interpret(small["elementwise"], {"x": x, "b": inputs["b"][:300]})["y"]
        np.testing.assert_allclose(got, np.maximum(x * 2 + inputs["b"][:300], 0) * np.exp(-x), rtol=1e-6)
    elif case == 1:
        rows = inputs["x"][:5, :300]
        np.testing.assert_allclose(interpret(small["reduction"], {"x": rows})["y"], rows.sum(axis=1), atol=1e-4)
    else:
        a, b = inputs["a"][:37, :21], inputs["b"][:21, :29]
        k = gpu.matmul_kernel(37, 29, 21, tile=(16, 16, 8), per_thread=(2, 2))
        np.testing.assert_allclose(interpret(k, {"a": a, "b": b})["c"], a @ b, rtol=1e-5, atol=1e-5)


def test_interpreter_reports_a_barrier_some_threads_skip():
    from weft.compiler.llvm.expr import Buffer, const
    from weft.compiler.llvm.lower import Barrier, For, If, LoweredKernel, LoweredStage, Seq, Store
    from weft.compiler.llvm.schedule import Axis

    y = Buffer("y", (4,))
    tx = Axis("tx", 4)
    body = For(tx, "threadIdx.x", Seq([If(tx.lt(2), Barrier()), Store(y, (tx,), const(1.0, "f32"))]))
    lk = LoweredKernel("bad", [y], [LoweredStage("bad", body, [], {"threadIdx.x": 4})])
    with pytest.raises(InterpreterError, match="finished while 2 wait at a barrier"):
        interpret(lk, {})


def _tiny_cnn():
    inits = {"w1": rand(8, 3, 3, 3, seed=1, scale=0.3), "b1": rand(8, seed=2), "w2": rand(5, 8, seed=3, scale=0.3),
             "b2": rand(5, seed=4)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["z"], transB=1),
             helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    return make_model(nodes, {"x": [2, 3, 6, 6]}, {"y": [2, 5]}, inits)


def test_whole_graph_gpu_schedules_interpreted_against_onnxruntime():
    model = _tiny_cnn()
    x = rand(2, 3, 6, 6, seed=7)
    got = interpret_plan(gpu_steps(weft.compile(model, target="cpu").graph), {"x": x})["y"]
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@needs_ptxas
@pytest.mark.parametrize("name", ["small_resnet", "resnet18"])
def test_every_kernel_of_a_model_assembles(name):
    graph = weft.compile(models.MODELS[name](), target="cpu").graph
    plan = gpu_steps(graph)
    texts = {ptx([step.kernel])[0] for step in plan.steps}
    for text in texts:
        assert ptxas(text)  # raises PtxasError with ptxas's message otherwise
    assert {step.node for step in plan.steps} == {node.name for node in graph.nodes}


# ---- on a GPU ---------------------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("case", range(3), ids=["elementwise", "reduction", "matmul"])
def test_kernels_run_on_the_gpu(case):
    _, kernel, inputs, _, want = _cases()[case]
    arrays = [inputs[b.name] for b in kernel.inputs]
    result = np.empty(want.shape, np.float32)
    GpuKernel(kernel)(*arrays, result)
    np.testing.assert_allclose(result, want, rtol=1e-5, atol=1e-4)


@needs_gpu
@pytest.mark.parametrize("name", ["small_resnet", "resnet18"])
def test_cuda_device_runs_whole_models(name):
    model = models.MODELS[name]()
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = {inp.name: rand(*shape, seed=1)}
    got = InferenceSession(weft.compile(model, target="cpu"), device="cuda").run(None, x)[0]
    want = ort_run(model, x)[0]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.skipif(GPU, reason="a GPU is present")
def test_cuda_device_without_a_gpu_says_why():
    art = weft.compile(_tiny_cnn(), target="cpu")
    with pytest.raises(DeviceError, match="device 'cuda': "):
        InferenceSession(art, device="cuda")


def test_unscheduled_stage_still_lowers_for_the_gpu():
    """A stage nobody scheduled runs as one thread (correct, slow): the generic schedule is opt-in."""
    from weft.compiler.llvm.expr import Buffer

    x = Buffer("x", (3, 4))
    y = compute("y", (3, 4), lambda i, j: x[i, j] * 2.0)
    _, (launches,) = ptx([Kernel("one_thread", [x], [y.out], [y])])
    assert launches[0].grid == (1, 1, 1) and launches[0].block == (1, 1, 1)
    xv = rand(3, 4)
    np.testing.assert_array_equal(interpret(Kernel("one_thread", [x], [y.out], [y]), {"x": xv})["y"], xv * 2)


@pytest.mark.slow
def test_quantized_graph_on_gpu_schedules_is_bit_exact():
    """Integer layers scheduled for the GPU (interpreted thread by thread) equal the reference to the bit."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["y"], kernel_shape=[1, 1])]
    model = make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": None},
                       {"w1": rand(4, 3, 3, 3, seed=1, scale=0.3), "w2": rand(5, 4, 1, 1, seed=2)})
    art = weft.compile(model, calibration={"x": rand(4, 1, 3, 6, 6, seed=3)})
    x = {"x": rand(1, 3, 6, 6, seed=4)}
    (got,) = interpret_plan(gpu_steps(art.graph), x).values()
    np.testing.assert_array_equal(got, InferenceSession(art, device="ref").run(None, x)[0])
