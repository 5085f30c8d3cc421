"""Shared by the driver, safety, rtl and pynq tests: a compiled small model on `tiny` and its feeds."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from weft.compiler import models
from weft.isa.encoding import decode_insns, encode_insns
from weft.runtime.register_backend import FsimBackend

from .test_e2e import _compile, _shape
from .test_frontend_util import rand

#: The rtl device's simulators as fixture parameters: Verilator, and Icarus (slow).
RTL_SIMULATORS = ["verilator", pytest.param("icarus", marks=[pytest.mark.slow, pytest.mark.rtl("icarus")])]


@functools.cache
def compiled(name: str = "mlp", config: str = "tiny") -> tuple[Any, dict[str, np.ndarray]]:
    model = models.MODELS[name]()
    art = _compile(model, config)
    input_name, shape = _shape(model)
    return art, {input_name: rand(*shape, seed=3)}


def first_layer_image(art: Any) -> tuple[np.ndarray, dict[str, Any], np.ndarray]:
    """(DRAM image with the constants, first accelerator layer, its decoded instructions)."""
    meta = art.sections["accel"].meta
    image = np.zeros(meta["dram_bytes"], dtype=np.uint8)
    const = art.sections["accel"].array("const")
    image[meta["const_base"]:meta["const_base"] + const.size] = const
    layer = meta["layers"][0]
    words = image[layer["insn_addr"]:layer["insn_addr"] + layer["insn_count"] * layer["insn_bytes"]]
    return image, layer, decode_insns(art.config, words)


def with_insns(art: Any, image: np.ndarray, layer: dict[str, Any], insns: np.ndarray) -> np.ndarray:
    out = image.copy()
    words = np.frombuffer(encode_insns(art.config, insns), dtype=np.uint8)
    out[layer["insn_addr"]:layer["insn_addr"] + words.size] = words
    return out


class CountingBackend(FsimBackend):
    """Counts START writes: a refused launch must not start the accelerator."""

    starts = 0

    def _start(self) -> None:
        type(self).starts += 1
        super()._start()


def rtl_equals_fsim(art: Any, feeds: dict[str, np.ndarray], timing: str = "pynq", chains: bool = True
                    ) -> tuple[Any, dict[str, Any]]:
    """Run `art` on fsim and on the RTL (Verilator, DRAM timing `timing`; both with `chains` or layer by
    layer), assert the outputs are bit-exact, and return the fsim session and the RTL run's stats."""
    import weft

    fsim = weft.InferenceSession(art, device="fsim", chains=chains)
    want = fsim.run(None, feeds)
    rtl = weft.InferenceSession(art, device="rtl", simulator="verilator", timing=timing, chains=chains)
    try:
        got = rtl.run(None, feeds)
        stats = rtl.stats
    finally:
        rtl.device.close()
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g)
    return fsim, stats
