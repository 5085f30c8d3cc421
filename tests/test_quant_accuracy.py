"""What the issue must show: int8 on the reference device tracks float onnxruntime (cosine >= 0.99 on
the logits of every model), and the digits CNN keeps its accuracy within one point."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.compiler import models

from .test_frontend_util import cosine, ort_run


def _check(model, *, calibration_batches: int, trials: int, seed: int = 0) -> float:
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    calibration = rng.standard_normal((calibration_batches, *shape)).astype(np.float32)
    sess = weft.InferenceSession(weft.compile(model, calibration={name: calibration}), device="ref")
    worst = 1.0
    for _ in range(trials):
        x = rng.standard_normal(shape).astype(np.float32)
        worst = min(worst, cosine(sess.run(None, {name: x})[0], ort_run(model, {name: x})[0]))
    return worst


@pytest.mark.parametrize(("builder", "options"), [
    ("small_resnet", {}), ("vgg_small", {}), ("mlp", {"batch": 8}), ("awkward_cnn", {"batch": 2}),
    ("reshape_net", {}),
])
def test_int8_tracks_float(builder, options):
    assert _check(models.MODELS[builder](**options), calibration_batches=16, trials=5) >= 0.99


def test_resnet18_int8_tracks_float():
    """ResNet-18 on 224x224 (1.8 GMAC): compile with 4 calibration images, run on ref, compare logits."""
    assert _check(models.resnet18(), calibration_batches=4, trials=2) >= 0.99


def test_digits_accuracy_within_one_point():
    model = models.train_digits_cnn()
    x_train, _, x_test, y_test = models.digits_data()
    float_acc = models.accuracy(model, x_test, y_test)
    sess = weft.InferenceSession(weft.compile(model, calibration={"input": x_train[:200]}))
    int8_acc = models.accuracy(lambda x: np.concatenate([sess.run(None, {"input": row[None]})[0] for row in x]),
                               x_test, y_test)
    assert float_acc > 0.9
    assert abs(int8_acc - float_acc) <= 0.01, (float_acc, int8_acc)
