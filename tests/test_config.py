"""The config: presets, validation rules, VTA format, hash, derived values."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from weft.config import PRESETS, AcceleratorConfig, ConfigError, load_config

VTA_DEFAULT = {
    "TARGET": "sim", "HW_VER": "0.0.2", "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5,
    "LOG_BATCH": 0, "LOG_BLOCK": 4, "LOG_UOP_BUFF_SIZE": 15, "LOG_INP_BUFF_SIZE": 15,
    "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17,
}


def test_vta_default_config_loads_with_vta_depths(tmp_path):
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(VTA_DEFAULT))
    c = load_config(path)
    assert (c.uop_rows, c.inp_rows, c.wgt_rows, c.acc_rows) == (8192, 2048, 1024, 2048)
    assert c.out_rows == 2048 and c.uop_bits == 32
    assert c.describe()["derived"]["insn_bits"] == 128
    assert dict(c.extras) == {"TARGET": "sim", "HW_VER": "0.0.2"}
    # The VTA file describes the same hardware as our default preset.
    assert c.hash == PRESETS["default"].hash


def test_presets_match_their_descriptions():
    d = PRESETS["default"]
    assert (d.batch, d.block_in, d.block_out, d.inp_width, d.wgt_width, d.acc_width) == (1, 16, 16, 8, 8, 32)
    assert (d.uop_buff_bytes, d.inp_buff_bytes, d.wgt_buff_bytes, d.acc_buff_bytes) == (
        32 << 10, 32 << 10, 256 << 10, 128 << 10)
    assert d.bus_width == 64 and d.clock_mhz == 100
    assert d.peak_gops == pytest.approx(51.2)
    assert PRESETS["zcu104"].bus_width == 128
    assert PRESETS["int4w"].wgt_width == 4
    assert PRESETS["rect"].block_in != PRESETS["rect"].block_out
    assert len({c.hash for c in PRESETS.values()}) == len(PRESETS)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"block_in": 12}, "block_in", "power of two"),
        ({"batch": 0}, "batch", "power of two"),
        ({"inp_width": 7}, "inp_width", "one of"),
        ({"acc_width": 8}, "acc_width", "one of"),
        ({"inp_buff_bytes": 8}, "inp_buff_bytes", "smaller than one input tile"),
        ({"wgt_buff_bytes": 100}, "wgt_buff_bytes", "power of two"),
        ({"bus_width": 48}, "bus_width", "one of"),
        ({"clock_mhz": 0}, "clock_mhz", "1..1000"),
        ({"token_queue_depth": 3}, "token_queue_depth", "power of two"),
        ({"out_buff_bytes": 1024}, "out_buff_bytes", "mirrors the accumulator"),
        ({"acc_buff_bytes": 1 << 24}, "buffer sizes", "instruction word"),
        ({"block_in": 2, "inp_width": 2}, "inp_width", "whole number of bytes"),
    ],
)
def test_bad_config_names_field_and_rule(changes, field, words):
    with pytest.raises(ConfigError) as err:
        PRESETS["default"].replace(**changes)
    assert err.value.field == field
    assert field in str(err.value) and words in str(err.value)


def test_hash_is_stable_and_ignores_name():
    a = PRESETS["default"]
    assert a.hash == AcceleratorConfig(name="other").hash == "7ec8a90ba686fc69"
    assert a.replace(clock_mhz=200).hash != a.hash


def test_round_trip_through_json(tmp_path):
    for config in PRESETS.values():
        path = tmp_path / f"{config.name}.json"
        path.write_text(json.dumps(config.to_dict()))
        again = load_config(path)
        assert again == config and again.hash == config.hash


def test_unknown_preset_or_field_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope"):
        load_config("nope")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"block_inn": 16}))
    with pytest.raises(ConfigError, match="block_inn"):
        load_config(path)
    missing = dict(VTA_DEFAULT)
    del missing["LOG_BLOCK"]
    with pytest.raises(ConfigError, match="LOG_BLOCK"):
        AcceleratorConfig.from_vta(missing)


@st.composite
def configs(draw):
    """Random configs that are valid by construction or rejected with a ConfigError."""
    pow2 = lambda lo, hi: st.integers(lo, hi).map(lambda e: 1 << e)  # noqa: E731
    kwargs = dict(
        batch=draw(pow2(0, 2)), block_in=draw(pow2(1, 5)), block_out=draw(pow2(1, 5)),
        inp_width=draw(st.sampled_from([4, 8])), wgt_width=draw(st.sampled_from([2, 4, 8])),
        acc_width=draw(st.sampled_from([16, 32])), out_width=draw(st.sampled_from([4, 8])),
        uop_buff_bytes=draw(pow2(8, 16)), inp_buff_bytes=draw(pow2(8, 17)), wgt_buff_bytes=draw(pow2(8, 19)),
        acc_buff_bytes=draw(pow2(9, 18)), bus_width=draw(st.sampled_from([32, 64, 128])),
    )
    try:
        return AcceleratorConfig(**kwargs)
    except ConfigError:
        return None


@settings(max_examples=200, deadline=None)
@given(configs())
def test_random_valid_configs_derive_consistent_values(config):
    assume(config is not None)
    d = config.describe()
    assert d["hash"] == config.hash
    for used in d["derived"]["insn_used_bits"].values():
        assert used <= 128
    for mem in ("uop", "inp", "wgt", "acc", "out"):
        rows = getattr(config, f"{mem}_rows")
        assert rows >= 1
    assert 1 << config.acc_index_bits >= config.acc_rows
