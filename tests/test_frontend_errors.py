"""Every way a model can fail to compile: the error is raised at compile time, is a WeftError subclass,
and its message names the culprit (node, op type, attribute, input, file)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import weft
from weft.compiler.onnx_import import load_model
from weft.config import PRESETS
from weft.core.errors import ModelError, QuantizationError, UnsupportedError
from weft.errors import WeftError

from .test_frontend_util import make_model, rand

W = rand(4, 3, 3, 3, seed=1)


def _conv_model(**conv_attrs: object) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="the_conv", **conv_attrs)
    return make_model([node], {"x": [1, 3, 8, 8]}, {"y": None}, {"w": W})


def test_unsupported_op_names_node_and_op():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok"),
             helper.make_node("Hardmax", ["r"], ["y"], name="the_hardmax")]
    with pytest.raises(UnsupportedError, match=r"node 'the_hardmax' \(Hardmax\): op 'Hardmax' is not supported"):
        weft.compile(make_model(nodes, {"x": [1, 3, 4, 4]}, {"y": None}), target="cpu")


@pytest.mark.parametrize(("attrs", "pattern"), [
    ({"dilations": [2, 2]}, r"node 'the_conv' \(Conv\): dilations \[2, 2\] are not supported"),
    ({"kernel_shape": [3, 3, 3]}, r"node 'the_conv' \(Conv\): only 2-D windows"),
])
def test_unsupported_conv_attributes_name_what_is_missing(attrs, pattern):
    with pytest.raises(UnsupportedError, match=pattern):
        weft.compile(_conv_model(**attrs), target="cpu")


def test_a_group_that_does_not_divide_the_channels_is_named():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="the_conv", group=2)],
                       {"x": [1, 3, 8, 8]}, {"y": None}, {"w": rand(4, 1, 3, 3)})
    with pytest.raises(ModelError, match=r"node 'the_conv' \(Conv\): weights \[4, 1, 3, 3\] do not match an input "
                                         r"with 3 channels in 2 group"):
        weft.compile(model, target="cpu")


def test_unknown_attribute_is_named():
    node = helper.make_node("Relu", ["x"], ["y"], name="odd", alpha=0.1)
    with pytest.raises(UnsupportedError, match=r"node 'odd' \(Relu\): attribute 'alpha' is not supported"):
        weft.compile(make_model([node], {"x": [1, 4]}, {"y": None}), target="cpu")


def test_pad_modes_other_than_constant_are_refused():
    node = helper.make_node("Pad", ["x", "p"], ["y"], name="mirror", mode="reflect")
    model = make_model([node], {"x": [1, 2, 4, 4]}, {"y": None}, {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})
    with pytest.raises(UnsupportedError, match=r"node 'mirror' \(Pad\): mode 'reflect'"):
        weft.compile(model, target="cpu")


def test_other_operator_domains_are_refused():
    node = helper.make_node("Gelu", ["x"], ["y"], name="g", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(UnsupportedError, match=r"node 'g' \(Gelu\): operator domain 'com.microsoft'"):
        weft.compile(model, target="cpu")


def test_old_opsets_are_refused():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, {"y": None}, opset=6)
    with pytest.raises(UnsupportedError, match="opset 6 is older than 7"):
        weft.compile(model, target="cpu")


def test_non_float_inputs_are_refused():
    graph = helper.make_graph([helper.make_node("Identity", ["ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 4])])
    with pytest.raises(UnsupportedError, match="graph input 'ids' is int64"):
        weft.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), target="cpu")


def test_external_weights_of_a_model_proto_name_the_missing_file():
    model = _conv_model()
    init = model.graph.initializer[0]
    init.ClearField("raw_data")
    init.ClearField("float_data")
    init.data_location = TensorProto.EXTERNAL
    init.external_data.add(key="location", value="weights.bin")
    with pytest.raises(ModelError, match=r"tensor 'w' keeps its data in the external file 'weights\.bin'"):
        weft.compile(model, target="cpu")


def test_missing_input_names_the_node_and_the_value():
    nodes = [helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")]
    with pytest.raises(ModelError, match=r"node 'add_bias' \(Add\): input 'bias' is not defined"):
        weft.compile(make_model(nodes, {"x": [1, 4]}, {"y": None}), target="cpu")


def test_missing_graph_output_is_reported():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, {"z": None})
    with pytest.raises(ModelError, match="graph output 'z' is not computed"):
        weft.compile(model, target="cpu")


def test_dynamic_dimension_that_cannot_be_fixed_names_input_and_axis():
    model = _conv_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    with pytest.raises(ModelError, match=r"graph input 'x' has a dynamic dimension 2 \('height'\)"):
        weft.compile(model, target="cpu")
    art = weft.compile(model, target="cpu", input_shapes={"x": (1, 3, 8, 8)})
    assert art.graph.values["x"].shape == (1, 3, 8, 8)
    with pytest.raises(ModelError, match=r"input_shapes gives input 'x' the shape \[1, 4, 8, 8\]"):
        weft.compile(model, target="cpu", input_shapes={"x": (1, 4, 8, 8)})
    with pytest.raises(ModelError, match="input_shapes names 'y', which is not a graph input"):
        weft.compile(model, target="cpu", input_shapes={"y": (1,)})


def test_shape_that_depends_on_data_is_named():
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "xi"], ["y"], name="data_reshape")]
    with pytest.raises(UnsupportedError, match=r"node 'data_reshape' \(Reshape\): the target shape .* depends on "
                                               "runtime data"):
        weft.compile(make_model(nodes, {"x": [2]}, {"y": None}), target="cpu")


def test_inconsistent_shapes_name_the_node():
    nodes = [helper.make_node("Add", ["x", "k"], ["y"], name="bad_add")]
    model = make_model(nodes, {"x": [1, 4]}, {"y": None}, {"k": np.ones(3, np.float32)})
    with pytest.raises(ModelError, match=r"node 'bad_add' \(Add\): input shapes \[\[1, 4\], \[3\]\] do not broadcast"):
        weft.compile(model, target="cpu")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_unreadable_files_name_the_file(tmp_path, damage):
    data = _conv_model().SerializeToString()
    path = tmp_path / "model.onnx"
    path.write_bytes({"garbage": b"\x12\xff" + bytes(range(200)), "truncated": data[: len(data) // 2],
                      "empty": b""}[damage])
    with pytest.raises(ModelError, match=str(path)) as info:
        weft.compile(path, target="cpu")
    assert any(word in str(info.value) for word in ("truncated", "empty", "corrupt"))


def test_every_truncation_of_a_model_fails_cleanly(tmp_path):
    """Cutting a model file anywhere gives a WeftError (never a crash or a silently smaller model)."""
    data = _conv_model().SerializeToString()
    for cut in range(1, len(data), max(1, len(data) // 97)):
        with pytest.raises(WeftError):
            weft.compile(load_model(data[:cut]), target="cpu")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ModelError, match="no such model file"):
        weft.compile(tmp_path / "nope.onnx")


def test_calibration_errors_name_the_input():
    model = _conv_model()
    with pytest.raises(QuantizationError, match=r"calibration data for input 'x' has shape \[1, 3, 9, 9\]"):
        weft.compile(model, calibration={"x": rand(1, 3, 9, 9)})
    with pytest.raises(QuantizationError, match="calibration data names 'image', which is not a model input"):
        weft.compile(model, calibration={"image": rand(1, 3, 8, 8)})
    bad = rand(2, 1, 3, 8, 8)
    bad[1, 0, 0, 0, 0] = np.nan
    with pytest.raises(QuantizationError, match="calibration batch 1 of input 'x' holds NaN"):
        weft.compile(model, calibration={"x": bad})


def test_default_calibration_warns():
    with pytest.warns(weft.core.errors.CalibrationWarning, match="seeded random inputs"):
        weft.compile(_conv_model())


def test_accumulator_overflow_names_the_layer():
    """With a 16-bit accumulator, a 3x3x64 convolution cannot be requantized: instead of a model that
    wraps, the layer stays a float host layer that says why."""
    config = PRESETS["default"].replace(name="acc16", acc_width=16)
    w = rand(8, 64, 3, 3, seed=3)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="wide_conv", pads=[1, 1, 1, 1])],
                       {"x": [1, 64, 6, 6]}, {"y": None}, {"w": w})
    conv = weft.compile(model, config=config, calibration={"x": rand(2, 1, 64, 6, 6)}).graph.node("wide_conv")
    assert conv.op == "FusedConv" and conv.attrs["target"] == "host"
    assert re.fullmatch(r"calibrated accumulator values reach \d+, beyond the 16-bit accumulator",
                        conv.attrs["host_reason"])


def test_unequal_activation_widths_are_refused():
    config = PRESETS["default"].replace(name="i8o16", out_width=16)
    with pytest.raises(QuantizationError, match=r"out_width=16 .* inp_width=8"):
        weft.compile(_conv_model(), config=config, calibration={"x": rand(1, 3, 8, 8)})


def test_initializer_of_unsupported_type_is_named():
    model = _conv_model()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(2, np.float16), "half"))
    with pytest.raises(UnsupportedError, match="initializer 'half' has data type FLOAT16"):
        weft.compile(model, target="cpu")
