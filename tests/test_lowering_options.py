"""Each lowering option of the back end (tiles.Lowering: the epilogue's placement, the first weights in
pieces, two output tiles a thread, a residual added by the ALU, and those of CHOSEN_TILE_OPTIONS) runs
bit-exact on its own and with the others, forced on every layer: the code generator keeps an option only
where the timing model finds it faster, so a model compiled the usual way exercises each only where it
happens to win."""

from __future__ import annotations

import numpy as np
import pytest

from weft.compiler.backend import tiles
from weft.compiler.backend.schedule import Schedule
from weft.core.accel_section import accel_section

from .test_e2e import _compile, assert_bit_exact
from .test_frontend_util import rand

OPTIONS = [
    {"weight_pieces": 4},
    {"tile_slots": 2},
    {"tile_slots": 2, "epilogue_own_stage": True},
    {"tile_slots": 2, "epilogue_own_stage": True, "residual_alu": True},
    {"hold_epilogue": False, "tile_slots": 2, "epilogue_own_stage": True, "weight_pieces": 4},
]


@pytest.fixture(scope="module")
def small_resnet():
    from weft.compiler import models

    model = models.MODELS["small_resnet"]()
    art = _compile(model, "default")
    # Several output-channel tiles and input-channel stages a layer (the vectors and the residual change
    # between a thread's tasks): each convolution's chosen tiles, one channel block at a time.
    schedules = {}
    for layer in art.sections["accel"].meta["layers"]:
        sched = Schedule.from_dict(layer["schedule"])
        if layer["kind"] == "conv":
            sched = Schedule(**{**sched.to_dict(), "tile_oc": 1, "tile_ic": 1})
        schedules[layer["name"]] = sched.to_dict()
    return model, schedules


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()))
def test_each_lowering_option_forced_on_every_layer_is_bit_exact(small_resnet, options, monkeypatch):
    model, schedules = small_resnet
    monkeypatch.setattr(tiles, "DEFAULT_OPTIONS", {**tiles.DEFAULT_OPTIONS, **options})
    art = _compile(model, "default", schedules=schedules)  # given schedules: no timed variants
    layers = art.sections["accel"].meta["layers"]
    assert all(layer["lowering"] == tiles.DEFAULT_OPTIONS for layer in layers)
    assert any(layer["geometry"]["residual"] for layer in layers)
    assert_bit_exact(art, {"input": rand(1, 3, 32, 32, seed=4)})


def test_a_forced_option_changes_the_programs(small_resnet, monkeypatch):
    model, schedules = small_resnet
    plain = _compile(model, "default", schedules=schedules)
    monkeypatch.setattr(tiles, "DEFAULT_OPTIONS", {**tiles.DEFAULT_OPTIONS, **OPTIONS[3]})
    forced = _compile(model, "default", schedules=schedules)
    a, b = (np.asarray(accel_section(x).const) for x in (plain, forced))
    assert a.shape != b.shape or not np.array_equal(a, b)


def test_an_unknown_lowering_option_is_refused():
    from weft.compiler.backend.conv import ConvLowering

    with pytest.raises(TypeError, match="unknown lowering option 'tile_slot' \\(known: hold_epilogue"):
        ConvLowering("conv", None, Schedule(), None, None, (), {"tile_slot": 2})  # type: ignore[arg-type]


#: Options that apply to other tiles than one channel block at a time, forced on the tiles the code
#: generator picks: the two threads' first tasks interleaved by weight piece (weights every task shares),
#: each reduction step's input window once for both threads (one pixel tile), the threads' last
#: epilogues and stores in the pieces of their last GEMMs, a residual loaded ahead of weights in pieces, and
#: two tiles a thread sharing their vector rows (one output-channel tile).
CHOSEN_TILE_OPTIONS = [
    ("default", {"weight_pieces": 4, "interleave_first": True}),
    ("default", {"stage_inputs": True}),
    ("default", {"last_pieces": 4, "epilogue_pieces": 1}),
    ("default", {"last_pieces": 4, "epilogue_pieces": 2}),
    ("rect", {"last_pieces": 4, "epilogue_pieces": 2}),  # (two images a GEMM row; a piece's rows)
    ("default", {"weight_pieces": 4, "residual_first": True}),
    ("default", {"tile_slots": 2, "epilogue_own_stage": True}),
]


@pytest.fixture(scope="module")
def chosen_tiles():
    from weft.compiler import models

    model = models.MODELS["small_resnet"]()
    out = {}
    for config in sorted({c for c, _ in CHOSEN_TILE_OPTIONS}):
        art = _compile(model, config)
        out[config] = (art, {x["name"]: x["schedule"] for x in art.sections["accel"].meta["layers"]})
    return model, out


@pytest.mark.parametrize(("config", "options"), CHOSEN_TILE_OPTIONS,
                         ids=lambda x: x if isinstance(x, str) else "+".join(f"{k}={v}" for k, v in x.items()))
def test_options_forced_on_the_chosen_tiles_change_programs_and_are_bit_exact(chosen_tiles, config, options,
                                                                               monkeypatch):
    model, arts = chosen_tiles
    _, schedules = arts[config]
    plain = _compile(model, config, schedules=schedules)
    monkeypatch.setattr(tiles, "DEFAULT_OPTIONS", {**tiles.DEFAULT_OPTIONS, **options})
    forced = _compile(model, config, schedules=schedules)
    a, b = (np.asarray(accel_section(x).const) for x in (plain, forced))
    assert a.shape != b.shape or not np.array_equal(a, b)  # the option applies somewhere
    assert_bit_exact(forced, {"input": rand(1, 3, 32, 32, seed=5)})
