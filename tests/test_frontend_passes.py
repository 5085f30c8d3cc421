"""The pass pipeline: each pass's effect on graph structure (ops, edges, attributes), numerics kept by
the float rewrites, the verifier, and the JSON form of the IR."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from onnx import helper

from weft.compiler import fusion, models, passes
from weft.compiler.onnx_import import import_onnx
from weft.compiler.pipeline import Pass, build_pipeline, describe, float_passes, run_pipeline
from weft.compiler.verify import verify
from weft.config import PRESETS
from weft.core.errors import GraphError
from weft.core.ir import Graph, Node, Value, graph_from_dict, graph_to_dict
from weft.core.reference import run_reference
from weft.isa.arith import rq_fields

from .test_frontend_util import make_model, rand

CFG = PRESETS["default"]


def _float_graph(model, upto: str | None = None) -> Graph:
    graph = import_onnx(model)
    for p in float_passes():
        graph = p.run(graph)
        verify(graph)
        if p.name == upto:
            break
    return graph


def _resblock_model():
    rng = np.random.default_rng(0)
    c = 8
    inits = {
        "w1": rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.2,
        "g": rng.uniform(0.5, 1.5, c).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
        "m": rng.standard_normal(c).astype(np.float32), "v": rng.uniform(0.5, 2, c).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Add", ["x", "n"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    return make_model(nodes, {"x": [1, c, 6, 6]}, {"y": None}, inits)


def test_pipeline_is_a_visible_list_of_named_passes():
    accel = [p.name for p in build_pipeline("accel", CFG, [])]
    cpu = [p.name for p in build_pipeline("cpu", CFG)]
    assert accel[:2] == ["infer_shapes", "fold_constants"]
    assert accel[-7:] == ["calibrate", "quantize", "fuse_clamps", "im2col_host_convs", "pack_layout", "partition",
                          "fuse_pools"]
    assert "quantize" not in cpu and cpu[-1] == "partition"
    assert all(d["doc"] for d in describe(build_pipeline("accel", CFG, [])))
    with pytest.raises(ValueError, match="target must be one of accel, cpu"):
        build_pipeline("gpu", CFG)


def test_conv_bn_residual_relu_becomes_one_layer():
    model = _resblock_model()
    before = import_onnx(model)
    assert [n.op for n in before.nodes] == ["Conv", "BatchNormalization", "Add", "Relu"]
    graph = _float_graph(model)
    assert [n.op for n in graph.nodes] == ["FusedConv"]
    fused = graph.nodes[0]
    assert fused.inputs[0] == "x" and fused.inputs[3] == "x" and fused.outputs == ["y"]
    assert fused.attrs["act"] == "relu" and fused.attrs["pads"] == (1, 1, 1, 1)
    x = rand(1, 8, 6, 6)
    want = run_reference(passes.infer_shapes(before), {"x": x}).outputs["y"]
    np.testing.assert_allclose(run_reference(graph, {"x": x}).outputs["y"], want, rtol=1e-5, atol=1e-5)


def test_batchnorm_folds_into_weights():
    graph = _float_graph(_resblock_model(), upto="fold_batchnorm")
    assert graph.op_counts() == {"FusedConv": 1, "Add": 1, "Relu": 1}
    conv = graph.nodes[0]
    w, b = graph.constants[conv.inputs[1]], graph.constants[conv.inputs[2]]
    model = _resblock_model()
    inits = {t.name: t for t in model.graph.initializer}
    from onnx import numpy_helper

    g, beta, m, v = (numpy_helper.to_array(inits[k]).astype(np.float64) for k in ("g", "b", "m", "v"))
    s = g / np.sqrt(v + 1e-5)
    np.testing.assert_allclose(w, numpy_helper.to_array(inits["w1"]) * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(b, beta - m * s, rtol=1e-6, atol=1e-7)


def test_shape_subgraph_folds_to_a_constant():
    graph = import_onnx(models.reshape_net())
    assert {"Shape", "Gather", "Concat", "ConstantOfShape"} <= set(graph.op_counts())
    folded = passes.fold_constants(passes.infer_shapes(graph))
    assert not {"Shape", "Gather", "Unsqueeze", "Concat", "ConstantOfShape"} & set(folded.op_counts())
    reshape = next(n for n in folded.nodes if n.op == "Reshape")
    assert folded.is_constant(reshape.inputs[1])
    assert folded.constants[reshape.inputs[1]].tolist() == [2, -1]
    final = _float_graph(models.reshape_net())
    assert set(final.op_counts()) == {"FusedConv"}  # the view became a full-image convolution


def test_identity_and_dead_nodes_go_but_output_names_stay():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Identity", ["r"], ["out"], name="id"),
        helper.make_node("Dropout", ["r"], ["unused"], name="drop"),
        helper.make_node("Relu", ["unused"], ["dead"], name="dead_relu"),
    ]
    graph = _float_graph(make_model(nodes, {"x": [1, 4]}, {"out": None}))
    assert [(n.name, n.op, n.outputs) for n in graph.nodes] == [("relu", "Relu", ["out"])]
    assert graph.outputs == ["out"]


def test_pad_folds_into_the_next_conv():
    nodes = [helper.make_node("Pad", ["x", "p"], ["xp"], name="pad"),
             helper.make_node("Conv", ["xp", "w"], ["y"], name="conv", pads=[1, 0, 0, 1])]
    pads = np.array([0, 0, 2, 0, 0, 0, 0, 3], np.int64)
    model = make_model(nodes, {"x": [1, 3, 5, 5]}, {"y": None}, {"p": pads, "w": rand(2, 3, 3, 3)})
    graph = _float_graph(model, upto="fold_pad")
    assert [n.op for n in graph.nodes] == ["Conv"]
    assert graph.nodes[0].attrs["pads"] == (3, 0, 0, 4) and graph.nodes[0].inputs[0] == "x"


def test_flatten_then_dense_becomes_a_full_image_convolution():
    w = rand(5, 2 * 3 * 3)
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)]
    graph = _float_graph(make_model(nodes, {"x": [1, 2, 3, 3]}, {"y": None}, {"w": w}))
    (conv,) = graph.nodes
    assert conv.op == "FusedConv" and conv.inputs[0] == "x" and conv.attrs["out_rank"] == 2
    assert graph.constants[conv.inputs[1]].shape == (5, 2, 3, 3)


def test_leftover_batchnorm_and_channel_scale_become_channel_affine():
    c = 3
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("Mul", ["p", "k"], ["y"], name="scale")]
    inits = {"g": np.ones(c, np.float32) * 2, "b": np.zeros(c, np.float32), "m": np.ones(c, np.float32),
             "v": np.ones(c, np.float32), "k": np.arange(1, c + 1, dtype=np.float32).reshape(1, c, 1, 1)}
    graph = _float_graph(make_model(nodes, {"x": [1, c, 4, 4]}, {"y": None}, inits))
    assert [n.op for n in graph.nodes] == ["ChannelAffine", "MaxPool", "ChannelAffine"]
    np.testing.assert_allclose(graph.constants[graph.nodes[2].inputs[1]], [1, 2, 3])


def test_verifier_names_the_broken_invariant_and_the_pass():
    graph = Graph("g", inputs=["x"], outputs=["y"], values={"x": Value("x", (1, 4)), "y": Value("y", (1, 4))},
                  nodes=[Node("Relu", ["z"], ["y"], name="r")])
    with pytest.raises(GraphError, match="node 'r' \\(Relu\\) reads 'z' before anything defines it"):
        verify(graph)

    def breaks_ssa(g: Graph) -> Graph:
        g = g.copy()
        g.nodes.append(Node("Relu", [g.inputs[0]], [g.outputs[0]], name="dup"))
        return g

    good = passes.infer_shapes(import_onnx(_resblock_model()))
    with pytest.raises(GraphError, match=r"after pass 'oops': .*redefines 'y'"):
        run_pipeline(good, [Pass("oops", breaks_ssa, "")])


def test_every_intermediate_graph_verifies_and_quantized_layers_are_self_describing():
    seen: list[str] = []
    graph = import_onnx(models.small_resnet())
    pipeline = build_pipeline("accel", CFG, [{"input": rand(1, 3, 32, 32, seed=k)} for k in range(2)])
    final = run_pipeline(graph, pipeline, trace=lambda p, g: (verify(g), seen.append(p.name)))
    assert seen == [p.name for p in pipeline]
    assert set(final.op_counts()) == {"quantize", "qim2col", "qconv2d", "qavgpool", "dequantize"}
    for node in final.nodes:
        assert node.attrs["target"] == ("accel" if node.op.startswith("qconv") or node.op == "qavgpool" else "host")
    conv = final.node("layer1.0.conv2")
    assert len(conv.inputs) == 3  # input, packed weights, residual
    w = final.constants[conv.inputs[1]]
    assert w.shape == (1, 1, 3, 3, 16, 16) and w.dtype == np.int8
    kinds = [k for k, _ in conv.attrs["epilogue"]]
    assert kinds[0] == "add_vec" and "residual" in kinds and kinds[-1] == "rq_vec"
    assert np.all(rq_fields(conv.attrs["epilogue"][-1][1], 32)[2] == 1)  # the ReLU rides on the last RQ
    assert final.meta["partition"][1] == {"target": "accel", "nodes": [n.name for n in final.nodes[2:-1]]}


def test_graph_json_round_trip_is_exact():
    graph = run_pipeline(import_onnx(models.awkward_cnn()),
                         build_pipeline("accel", CFG, [{"input": rand(1, 3, 29, 29)}]))
    store: dict[str, np.ndarray] = {}

    def put(a: np.ndarray) -> str:  # content-addressed, so equal graphs give equal JSON
        key = f"{a.dtype}{list(a.shape)}{hashlib.sha256(a.tobytes()).hexdigest()}"
        store[key] = a
        return key

    data = graph_to_dict(graph, put)
    again = graph_from_dict(data, store.__getitem__)
    verify(again)
    assert graph_to_dict(again, put) == graph_to_dict(graph, put)
    for node in again.nodes:
        for kind, operand in node.attrs.get("epilogue", ()):
            assert isinstance(kind, str) and isinstance(operand, (int, np.ndarray, tuple))


def test_fusions_keep_float_results():
    model = models.awkward_cnn()
    x = rand(1, 3, 29, 29, seed=4)
    plain = passes.infer_shapes(import_onnx(model))
    fused = _float_graph(model)
    assert len(fused) < len(plain)
    np.testing.assert_allclose(run_reference(fused, {"input": x}).outputs["logits"],
                               run_reference(plain, {"input": x}).outputs["logits"], rtol=1e-4, atol=1e-5)
    assert fusion.fuse_residual(fused).op_counts() == fused.op_counts()  # passes reach a fixed point
