"""Whole float models on the "cpu" device against onnxruntime, and the device's session behaviour: threads,
stats, intermediates, saved artifacts, errors, and no llvmlite at ``import weft.runtime``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.runtime import DeviceError, InferenceSession, available_devices

from .test_frontend_util import ort_run, rand

#: relative error bound against onnxruntime for whole networks (float32, different summation orders)
RTOL = 3e-5


def _input(model):
    inp = model.graph.input[0]
    return inp.name, [d.dim_value for d in inp.type.tensor_type.shape.dim]


def _compare(model, threads: int = 2, seed: int = 0) -> InferenceSession:
    name, shape = _input(model)
    x = {name: rand(*shape, seed=seed)}
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=threads)
    got = sess.run(None, x)[0]
    want = ort_run(model, x)[0]
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert got.shape == want.shape and err <= RTOL, f"relative error {err:.3g}"
    return sess


@pytest.mark.parametrize("name", ["mlp", "small_resnet", "vgg_small", "awkward_cnn", "reshape_net"])
def test_project_models_match_onnxruntime(name):
    sess = _compare(models.MODELS[name]())
    stats = sess.stats
    assert stats["device"] == "cpu" and stats["target"] == "cpu" and stats["threads"] == 2
    assert stats["macs"] == models.count_macs(models.MODELS[name]())
    assert all(layer["target"] == "host" for layer in stats["layers"])


def test_trained_digits_cnn_keeps_its_accuracy():
    model = models.train_digits_cnn()
    _, _, x_test, y_test = models.digits_data()
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu")
    name, _ = _input(model)
    scores = np.concatenate([sess.run(None, {name: x[None]})[0] for x in x_test[:120]])
    ours = float(np.mean(scores.argmax(axis=1) == y_test[:120]))
    theirs = models.accuracy(model, x_test[:120], y_test[:120])
    assert ours == theirs and ours > 0.85


def test_resnet18_matches_onnxruntime():
    sess = _compare(models.resnet18())
    steps = sess.device.plan.steps
    assert len(steps) == len(sess.artifact.graph.nodes) + 1  # one kernel per layer ...
    # ... and one pad kernel: convolutions and the max-pool write their outputs inside the zero border that
    # the padded convolutions after them read; only the model's input needs a padded copy
    assert [s.node for s in steps if s.kernel.name == "pad"] == ["conv1"]


def test_thread_counts_agree_to_the_bit():
    model = models.small_resnet()
    art = weft.compile(model, target="cpu")
    name, shape = _input(model)
    x = {name: rand(*shape, seed=3)}
    outs = [InferenceSession(art, device="cpu", threads=t).run(None, x)[0] for t in (1, 2, 5)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_intermediates_saved_artifacts_and_repeated_runs(tmp_path):
    model = models.vgg_small()
    path = weft.compile(model, target="cpu").save(tmp_path / "vgg.weft")
    sess = InferenceSession(str(path), device="cpu", threads=1)
    name, shape = _input(model)
    x1, x2 = rand(*shape, seed=1), rand(*shape, seed=2)
    y1 = sess.run(None, {name: x1}, keep_intermediates=True)[0]
    y2 = sess.run(None, {name: x2})[0]
    np.testing.assert_array_equal(sess.run(None, {name: x1})[0], y1)  # buffers are reused, results are not
    assert not np.array_equal(y1, y2)
    ref = InferenceSession(str(path), device="ref")
    ref.run(None, {name: x1}, keep_intermediates=True)
    sess.run(None, {name: x1}, keep_intermediates=True)
    for node in sess.artifact.graph.nodes:  # every layer's output, in its logical (plain) layout
        out = node.outputs[0]
        np.testing.assert_allclose(sess.intermediate(out), ref.intermediate(out), rtol=1e-4, atol=1e-4)


def test_device_options_and_errors():
    assert {"cpu", "cuda"} <= set(available_devices())
    art = weft.compile(models.mlp(), target="cpu")
    with pytest.raises(DeviceError, match="threads must be at least 1"):
        InferenceSession(art, device="cpu", threads=0)
    sess = InferenceSession(art, device="cpu")
    with pytest.raises(weft.runtime.FeedError, match="input 'input' must have shape"):
        sess.run(None, {"input": np.zeros((1, 2), np.float32)})


def test_runtime_import_does_not_load_llvmlite(tmp_path):
    """A board has no llvmlite: the runtime imports, lists "cpu", and creating it says what is missing."""
    from .numpy_only import BLOCKER

    path = weft.compile(models.mlp(), target="cpu").save(tmp_path / "mlp.weft")
    code = BLOCKER + (
        "import weft.runtime\n"
        "print('llvmlite' in sys.modules, 'cpu' in weft.runtime.available_devices())\n"
        "try:\n"
        f"    weft.runtime.InferenceSession({str(path)!r}, device='cpu')\n"
        "except weft.runtime.DeviceError as err:\n"
        "    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "False True"
    assert lines[1].startswith("device 'cpu' needs llvmlite") and "weft[compiler]" in lines[1]


def test_compile_cache_dir_is_explicit_and_reused(tmp_path):
    from weft.compiler.llvm.jit import cache_info, clear_cache

    art = weft.compile(models.small_resnet(), target="cpu")
    clear_cache()
    first = InferenceSession(art, device="cpu", cache_dir=tmp_path)
    stored = sorted(p.name for p in tmp_path.glob("*.o"))
    assert stored and cache_info()["misses"] == len(stored)
    clear_cache()  # as a new process would start: only the folder remains
    second = InferenceSession(art, device="cpu", cache_dir=tmp_path)
    assert cache_info()["misses"] == 0 and cache_info()["disk_hits"] == len(stored)
    x = {"input": rand(1, 3, 32, 32, seed=4)}
    np.testing.assert_array_equal(first.run(None, x)[0], second.run(None, x)[0])


def test_buffers_lie_in_one_huge_page_arena():
    """Every buffer of a plan, the packed weights copied in, sits 64-byte aligned in one arena that starts on
    a huge page (so the kernel can back it with transparent huge pages), and the model still matches
    onnxruntime from there."""
    from weft.compiler.llvm.graph import HUGE_PAGE

    sess = _compare(models.MODELS["small_resnet"](), threads=1)
    roots = [t for t in sess.device.plan.tensors if t.alias_of is None]
    assert any(t.constant for t in roots)
    addresses = sorted(t.array.ctypes.data for t in roots)
    assert addresses[0] % HUGE_PAGE == 0 and all(a % 64 == 0 for a in addresses)
    assert len({id(_base(t.array)) for t in roots}) == 1


def _base(array: np.ndarray) -> object:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base


def test_inputs_are_read_where_they_lie_or_copied():
    """A C-contiguous float32 feed is read by the kernels in place (no copy), a strided one is copied in; each
    run sees its own feed, and intermediates still hold the input of the last run."""
    model = models.MODELS["small_resnet"]()
    name, shape = _input(model)
    sess = InferenceSession(weft.compile(model, target="cpu"), device="cpu", threads=2)
    plan = sess.device.plan
    feeds = [rand(*shape, seed=s) for s in range(3)]
    strided = np.asfortranarray(feeds[2])
    wants = [ort_run(model, {name: f})[0] for f in feeds]
    for feed, want in zip([feeds[0], feeds[1], strided, feeds[0]], [*wants, wants[0]], strict=True):
        got = sess.run(None, {name: feed}, keep_intermediates=True)[0]
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= RTOL
        np.testing.assert_array_equal(sess.intermediate(name), feed)
    assert plan._feed_slots.get(name)  # the kernels that read the input
    feed = feeds[1].copy()
    first = sess.run(None, {name: feed})[0]
    feed *= 2  # the caller's array changes between runs: the next run reads the new values
    np.testing.assert_array_equal(sess.run(None, {name: feeds[1]})[0], first)
    assert not np.array_equal(sess.run(None, {name: feed})[0], first)
