"""`weft bench zoo`: the onnx wheel's light models, placeholders made random, compiled and compared."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from weft.cli import main
from weft.config import load_config
from weft.tools.zoo import light_models_dir, model_files, with_logits_output, with_random_weights, zoo_row

LIGHT = {f.stem.removeprefix("light_"): f for f in model_files()}


def test_the_light_zoo_is_there():
    assert {"resnet50", "squeezenet", "shufflenet", "inception_v1", "densenet121", "bvlc_alexnet",
            "vgg19"} <= set(LIGHT)
    assert all(f.parent == light_models_dir() for f in LIGHT.values())


def test_random_weights_replace_every_placeholder_and_keep_real_initializers():
    model = onnx.load(str(LIGHT["bvlc_alexnet"]))
    placeholders = [n.output[0] for n in model.graph.node if n.op_type == "ConstantOfShape"]
    out = with_random_weights(model, seed=1)
    assert not any(n.op_type == "ConstantOfShape" for n in out.graph.node)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert set(placeholders) <= set(inits)
    assert inits["OC2_DUMMY_1"].tolist() == [1, 9216]  # the real Reshape target stays
    w = inits["conv2_w_0"]  # grouped conv (group 2): He-normal over its fan-in C/group * kh * kw
    assert w.dtype == np.float32 and abs(w.std() * np.sqrt(np.prod(w.shape[1:]) / 2) - 1) < 0.05
    assert [i.name for i in out.graph.input] == ["data_0", "OC2_DUMMY_1"]  # an initializer listed as input
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    probs = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"data_0": x})
    assert np.isfinite(probs[0]).all() and abs(probs[0].sum() - 1) < 1e-3
    again = with_random_weights(model, seed=1)
    assert all(np.array_equal(inits[t.name], onnx.numpy_helper.to_array(t)) for t in again.graph.initializer)


def test_logits_are_compared_when_the_model_ends_in_softmax():
    model = with_random_weights(onnx.load(str(LIGHT["squeezenet"])))
    out, k = with_logits_output(model)
    assert k == 1 and len(out.graph.output) == 2
    producers = {o: n for n in out.graph.node for o in n.output}
    assert producers[out.graph.output[0].name].op_type == "Softmax"
    assert producers[out.graph.output[1].name].op_type != "Softmax"


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_small_light_models_meet_the_bar_on_default(name):
    """The two smallest: Dropout with its mask (SqueezeNet); grouped 1x1 convolutions and the channel
    shuffle as Reshape/Transpose (ShuffleNet)."""
    row = zoo_row(LIGHT[name], load_config("default"))
    assert row["ok"], row.get("error")
    assert row["compared"] == "logits"
    assert row["cosine_vs_float"] >= 0.99
    assert row["fsim_equals_ref"] is True
    assert row["accel_mac_fraction"] >= 0.95
    assert row["cpu_relative_error"] <= 1e-4


def test_bench_zoo_refuses_a_folder_for_other_benchmarks(tmp_path, capsys):
    assert main(["bench", "fsim", str(tmp_path)]) == 2
    assert "benchmark 'fsim' takes no folder argument" in capsys.readouterr().err


def test_bench_zoo_names_an_empty_folder(tmp_path, capsys):
    assert main(["bench", "zoo", str(tmp_path)]) == 2
    assert "holds no .onnx files" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny", "default"])
@pytest.mark.parametrize("name", sorted(LIGHT))
def test_every_light_model_meets_the_bar(name, config):
    row = zoo_row(LIGHT[name], load_config(config))
    assert row["ok"], row.get("error")
    assert row["cosine_vs_float"] >= 0.99
    assert row["fsim_equals_ref"] is True
    assert row["cpu_relative_error"] <= 1e-4
