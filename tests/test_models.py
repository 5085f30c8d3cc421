"""The compiler's test models: valid ONNX at every opset, runnable on onnxruntime, deterministic, sane.

References here are independent of the builders: MAC and parameter counts of ResNet-18 are derived from
the torchvision architecture by hand, the numpy kernels are checked against onnxruntime, the digits
gradient against finite differences.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from weft.compiler import models
from weft.compiler.models import (
    MODELS,
    accuracy,
    awkward_cnn,
    batched_runner,
    build,
    count_macs,
    count_parameters,
    digits_data,
    mlp,
    reshape_net,
    resnet18,
    small_resnet,
    train_digits_cnn,
    vgg_small,
)

# Builders cheap enough to build many times; resnet18 and digits_cnn have their own tests.
SMALL = {name: MODELS[name] for name in ("small_resnet", "vgg_small", "mlp", "awkward_cnn", "reshape_net")}
# Opsets around every change of form the builders handle: Clip and Pad (11), Dropout (12), Unsqueeze and
# Softmax (13), BatchNormalization (14, 15), Pad axes (18), up to a recent one.
OPSETS = (9, 10, 11, 12, 13, 14, 15, 17, 18, 21)


def input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def random_input(model: onnx.ModelProto, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(input_shape(model)).astype(np.float32)


def run(model: onnx.ModelProto, x: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, {model.graph.input[0].name: x})


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of the model that also returns the named intermediate tensors."""
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    return extended


def assert_sane(y: np.ndarray) -> None:
    """Finite and not degenerate: rows vary across classes."""
    assert np.isfinite(y).all()
    assert (y.std(axis=-1) > 1e-3).all(), y.std(axis=-1)


@pytest.fixture(scope="module")
def resnet() -> onnx.ModelProto:
    return resnet18()


@pytest.fixture(scope="module")
def digits() -> tuple[onnx.ModelProto, tuple[np.ndarray, ...]]:
    return train_digits_cnn(seed=0), digits_data()


# ---- ResNet-18 ------------------------------------------------------------------------------------------


def resnet18_reference_counts() -> tuple[int, int]:
    """(learnable parameters, MACs) of torchvision's resnet18, from its layer list."""
    params, macs = 0, 0

    def conv(cin: int, cout: int, k: int, size_out: int) -> None:
        nonlocal params, macs
        params += cout * cin * k * k + 2 * cout  # conv without bias, then BN gamma and beta
        macs += cout * size_out * size_out * cin * k * k

    conv(3, 64, 7, 112)
    cin, size = 64, 56
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            size //= stride
            conv(cin, width, 3, size)
            conv(width, width, 3, size)
            if stride == 2:
                conv(cin, width, 1, size)
            cin = width
    params += 512 * 1000 + 1000
    macs += 512 * 1000
    return params, macs


def test_resnet18_topology(resnet):
    ops = [node.op_type for node in resnet.graph.node]
    assert ops.count("Conv") == 20
    assert sum("downsample" in node.name for node in resnet.graph.node if node.op_type == "Conv") == 3
    assert ops.count("BatchNormalization") == 20
    assert ops.count("Add") == 8
    assert (ops.count("MaxPool"), ops.count("GlobalAveragePool"), ops.count("Flatten"), ops.count("Gemm")) == (1,) * 4
    conv1 = resnet.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in conv1.attribute}
    assert (conv1.op_type, attrs["kernel_shape"], attrs["strides"], attrs["pads"]) == ("Conv", [7, 7], [2, 2], [3] * 4)
    assert input_shape(resnet) == [1, 3, 224, 224]
    assert resnet.graph.input[0].name == "input" and resnet.graph.output[0].name == "logits"
    assert resnet.opset_import[0].version == 17


def test_resnet18_counts(resnet):
    params, macs = resnet18_reference_counts()
    assert params == 11_689_512  # torchvision's published count
    assert count_parameters(resnet) == params
    assert count_macs(resnet) == macs
    assert 1.81e9 < macs < 1.83e9


def test_resnet18_runs_with_sane_logits(resnet):
    x = np.random.default_rng(5).standard_normal((2, 1, 3, 224, 224)).astype(np.float32)
    first, second = (run(resnet, image)[0] for image in x)
    assert first.shape == (1, 1000)
    assert_sane(first)
    assert 0.05 < first.std() < 10.0
    assert np.abs(first - second).max() > 0.1 * first.std()  # the input matters


def test_resnet18_batchnorm_outputs_stay_in_range(resnet):
    """Calibrated statistics keep every BN output near gamma * N(0, 1) + beta through all 20 layers."""
    names = [node.output[0] for node in resnet.graph.node if node.op_type == "BatchNormalization"]
    values = run(with_outputs(resnet, names), random_input(resnet, seed=7), names)
    for name, value in zip(names, values, strict=True):
        low = 0.1 if name.endswith("bn2") else 0.4  # the last BN of each block has gamma in [0.2, 0.5]
        assert low < value.std() < 2.5, (name, value.std())


def test_resnet18_is_deterministic_per_seed(resnet):
    assert resnet18(seed=0).SerializeToString() == resnet.SerializeToString()


# ---- the small models --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL)
def test_small_models_run_with_sane_outputs(name):
    model = SMALL[name]()
    (y,) = run(model, random_input(model))
    assert y.shape[0] == input_shape(model)[0]
    assert_sane(y)


@pytest.mark.parametrize("name", SMALL)
def test_small_models_are_deterministic_per_seed(name):
    builder = SMALL[name]
    assert builder(seed=3).SerializeToString() == builder(seed=3).SerializeToString()
    weights = [numpy_helper.to_array(t) for t in builder(seed=3).graph.initializer]
    others = [numpy_helper.to_array(t) for t in builder(seed=4).graph.initializer]
    assert any(w.shape == o.shape and not np.array_equal(w, o) for w, o in zip(weights, others, strict=True))


def weights(model: onnx.ModelProto) -> dict[str, bytes]:
    """Initializers that are weights, not settings that older opsets carry as attributes (scalars, pads, axes)."""
    return {t.name: t.SerializeToString() for t in model.graph.initializer
            if len(t.dims) > 0 and not t.name.endswith((".pads", ".axes"))}


@pytest.mark.parametrize("name", SMALL)
def test_every_opset_gives_the_same_function(name):
    builder = SMALL[name]
    reference = builder(opset=models.DEFAULT_OPSET)
    x = random_input(reference)
    (expected,) = run(reference, x)
    for opset in OPSETS:
        model = builder(opset=opset)
        assert model.opset_import[0].version == opset
        # The same weights (the opsets differ only in how settings like Clip bounds and Pad pads travel) ...
        assert weights(model) == weights(reference), f"opset {opset}"
        # ... computing the same function; onnxruntime picks other float kernels for some op versions, so
        # the last ulp may differ.
        (y,) = run(model, x)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6, err_msg=f"opset {opset}")
    builder(opset=models.max_opset())  # still passes the full checker at the newest opset onnx knows


def test_ops_take_the_form_of_their_opset():
    def node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
        return next(n for n in model.graph.node if n.op_type == op_type)

    old, new = awkward_cnn(opset=10), awkward_cnn(opset=11)
    assert len(node(old, "Clip").input) == 1 and {a.name for a in node(old, "Clip").attribute} == {"min", "max"}
    assert len(node(new, "Clip").input) == 3 and not node(new, "Clip").attribute
    assert len(node(old, "Pad").input) == 1 and len(node(new, "Pad").input) == 2
    assert len(node(vgg_small(opset=11), "Dropout").input) == 1
    assert len(node(vgg_small(opset=12), "Dropout").input) == 2
    assert len(node(reshape_net(opset=12), "Unsqueeze").input) == 1
    assert len(node(reshape_net(opset=13), "Unsqueeze").input) == 2


def test_batch_changes_only_the_batch():
    one, three = small_resnet(batch=1), small_resnet(batch=3)
    assert [t.SerializeToString() for t in one.graph.initializer] == [
        t.SerializeToString() for t in three.graph.initializer]
    x = np.random.default_rng(2).standard_normal((3, 3, 32, 32)).astype(np.float32)
    rows = np.concatenate([run(one, x[i:i + 1])[0] for i in range(3)])
    np.testing.assert_allclose(run(three, x)[0], rows, rtol=1e-5, atol=1e-6)


def test_small_resnet_batchnorm_outputs_stay_in_range():
    model = small_resnet()
    names = [node.output[0] for node in model.graph.node if node.op_type == "BatchNormalization"]
    for name, value in zip(names, run(with_outputs(model, names), random_input(model), names), strict=True):
        assert 0.1 < value.std() < 2.5, (name, value.std())


def test_mlp_has_batch_and_both_dense_forms():
    model = mlp(batch=4)
    ops = [node.op_type for node in model.graph.node]
    assert input_shape(model) == [4, 64]
    assert "MatMul" in ops and "Gemm" in ops and "Add" in ops and "Relu" in ops
    assert count_macs(model) == 4 * (64 * 128 + 128 * 64 + 64 * 10)


def test_awkward_cnn_has_the_awkward_shapes():
    model = onnx.shape_inference.infer_shapes(awkward_cnn(), strict_mode=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}
    attrs = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    ops = {n.op_type for n in model.graph.node}
    assert {"Pad", "Concat", "AveragePool", "Clip", "Mul", "Sum", "MaxPool"} <= ops
    weights = [list(t.dims) for t in model.graph.initializer if t.name.endswith(".weight") and len(t.dims) == 4]
    assert {w[2] for w in weights} == {1, 3, 7}
    channels = {w[0] for w in weights} | {w[1] for w in weights}
    assert {3, 5, 24, 40, 69} <= channels
    assert attrs["stem"]["strides"] == [2, 2] and attrs["stem"]["pads"] == [3, 3, 2, 2]
    assert attrs["reduce"]["strides"] == [2, 2] and attrs["reduce"]["pads"] == [0, 0, 1, 1]
    assert shapes["pad"] == [1, 3, 30, 30]
    assert shapes["concat"] == [1, 69, 15, 15]
    assert shapes["sum"] == [1, 40, 7, 7]


def test_reshape_net_folds_to_constants():
    model = reshape_net(batch=2)
    ops = [n.op_type for n in model.graph.node]
    for op in ("Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "ConstantOfShape", "Constant", "Identity"):
        assert op in ops, op
    shape_chain = ["view.shape", "view.size0", "view.size0_1d", "view.target"]
    assert run(model, random_input(model))[0].shape == (2, 10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    known = {v.name for v in inferred.graph.value_info}
    assert set(shape_chain) <= known
    assert count_macs(model) == 2 * (8 * 6 * 6 * 4 * 9 + 288 * 16 + 16 * 10)


# ---- digits --------------------------------------------------------------------------------------------


def test_digits_data_split():
    x_train, y_train, x_test, y_test = digits_data()
    assert x_train.shape == (1438, 1, 8, 8) and x_test.shape == (359, 1, 8, 8)
    assert x_train.dtype == np.float32 and x_train.min() == 0.0 and x_train.max() == 1.0
    assert set(np.unique(y_test)) == set(range(10))
    again = digits_data()
    assert all(np.array_equal(a, b) for a, b in zip(again, (x_train, y_train, x_test, y_test), strict=True))


def test_digits_cnn_float_accuracy(digits):
    model, (_, _, x_test, y_test) = digits
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu", "Conv", "Relu", "Flatten", "Gemm"]
    assert accuracy(model, x_test, y_test) >= 0.95


def test_digits_training_is_deterministic(digits):
    model, _ = digits
    assert train_digits_cnn(seed=0).SerializeToString() == model.SerializeToString()
    one, two = (train_digits_cnn(seed=seed, epochs=1).SerializeToString() for seed in (1, 2))
    assert one != two


def test_digits_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    params = {k: v.astype(np.float64) for k, v in models._digits_init(rng).items()}
    params = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}  # nonzero biases too
    x_train, y_train, _, _ = digits_data()
    x, y = x_train[:6].astype(np.float64), y_train[:6]
    _, grads = models._digits_loss_and_grads(params, x, y)
    step = 1e-6
    for name, value in params.items():
        for index in rng.choice(value.size, size=4, replace=False):
            where = np.unravel_index(index, value.shape)
            saved = value[where]
            value[where] = saved + step
            up, _ = models._digits_loss_and_grads(params, x, y)
            value[where] = saved - step
            down, _ = models._digits_loss_and_grads(params, x, y)
            value[where] = saved
            assert math.isclose(grads[name][where], (up - down) / (2 * step), rel_tol=1e-4, abs_tol=1e-8), name


def test_batched_runner_pads_the_last_chunk(digits):
    model, (_, _, x_test, _) = digits
    batched = onnx.ModelProto()
    batched.CopyFrom(model)
    batched.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 7
    batched.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 7
    x = x_test[:23]  # 3 full chunks of 7 and one of 2
    np.testing.assert_allclose(batched_runner(batched)(x), batched_runner(model)(x), rtol=1e-5, atol=1e-5)
    assert accuracy(lambda rows: np.eye(10)[np.zeros(len(rows), int)], x, np.zeros(23, int)) == 1.0


# ---- numpy kernels against onnxruntime ------------------------------------------------------------------


def single_op_model(op_type: str, x_shape: list[int], weight: np.ndarray | None, **attrs: object) -> onnx.ModelProto:
    inputs = ["x"] + (["w"] if weight is not None else [])
    init = [numpy_helper.from_array(weight, "w")] if weight is not None else []
    graph = helper.make_graph([helper.make_node(op_type, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("k", "stride", "pads"), [(3, 1, (1, 1, 1, 1)), (3, 2, (0, 0, 1, 1)), (7, 2, (3, 2, 2, 3)),
                                                   (1, 2, (0, 0, 0, 0))])
def test_numpy_conv_matches_onnxruntime(k, stride, pads):
    rng = np.random.default_rng(k * 10 + stride)
    x = rng.standard_normal((2, 5, 13, 11)).astype(np.float32)
    w = rng.standard_normal((6, 5, k, k)).astype(np.float32)
    model = single_op_model("Conv", list(x.shape), w, kernel_shape=[k, k], strides=[stride] * 2, pads=list(pads))
    np.testing.assert_allclose(models._conv2d(x, w, None, stride, pads), run(model, x)[0], rtol=1e-4, atol=1e-4)


def test_numpy_maxpool_matches_onnxruntime():
    x = np.random.default_rng(0).standard_normal((1, 4, 15, 15)).astype(np.float32)
    model = single_op_model("MaxPool", list(x.shape), None, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(models._maxpool2d(x, 3, 2, 1), run(model, x)[0])


def test_col2im_is_the_adjoint_of_im2col():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8))
    cols, _, _ = models._im2col(x, 3, 2, (1, 0, 0, 1))
    c = rng.standard_normal(cols.shape)
    assert math.isclose(float((cols * c).sum()), float((x * models._col2im(c, x.shape, 3, 2, (1, 0, 0, 1))).sum()),
                        rel_tol=1e-12)


# ---- registry and errors -------------------------------------------------------------------------------


def test_build_saves_a_loadable_model(tmp_path):
    path = tmp_path / "nested" / "mlp.onnx"
    model = build("mlp", path, seed=2, batch=8)
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == model.SerializeToString()
    assert input_shape(loaded) == [8, 64]
    assert set(MODELS) == {"resnet18", "small_resnet", "vgg_small", "mlp", "awkward_cnn", "reshape_net", "digits_cnn",
                           "mobilenet_v2", "mobilenet_v2_224", "resnext"}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"unknown model 'resnet50'.*resnet18"):
        build("resnet50", "unused.onnx")
    with pytest.raises(ValueError, match="opset 8"):
        mlp(opset=8)
    with pytest.raises(ValueError, match="opset"):
        mlp(opset=models.max_opset() + 1)
    with pytest.raises(ValueError, match="batch must be at least 1, got 0"):
        vgg_small(batch=0)
    with pytest.raises(ValueError, match="num_classes"):
        awkward_cnn(num_classes=0)
