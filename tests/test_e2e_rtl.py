"""Compiled models on the generated RTL: every accelerator layer's program, replayed on Verilator from the
DRAM image the functional simulator started it from, leaves the same DRAM image (realistic DRAM timing)."""

from __future__ import annotations

import numpy as np
import pytest

from weft.compiler import models
from weft.config import PRESETS
from weft.sim.cosim import run_jobs
from weft.tools.bench_accel import replay_jobs

from .test_e2e import _compile, _shape
from .test_frontend_util import rand

pytestmark = pytest.mark.rtl


@pytest.mark.parametrize("name", ["mlp", pytest.param("awkward_cnn", marks=pytest.mark.slow)])
def test_compiled_layers_run_bit_exact_on_the_rtl(name):
    model = models.MODELS[name]()
    art = _compile(model, "tiny")
    input_name, shape = _shape(model)
    layers = [layer["name"] for layer in art.sections["accel"].meta["layers"]]
    jobs, after, _ = replay_jobs(art, {input_name: rand(*shape, seed=3)}, set(layers))
    results = run_jobs(PRESETS["tiny"], "verilator", [jobs[n] for n in layers], timing="pynq")
    for layer, result in zip(layers, results, strict=True):
        assert result.error_code == 0, (layer, result.report)
        image = after[layer]
        np.testing.assert_array_equal(result.dram[:image.size], image, err_msg=layer)
        assert result.cycles > 0
