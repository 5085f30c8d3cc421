"""Config files a user writes or `weft config` prints load back to the same design point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weft.cli import main
from weft.config import PRESETS, AcceleratorConfig, ConfigError, load_config


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_weft_config_output_loads_back_to_the_same_hash(preset: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "--config", preset]) == 0
    path = tmp_path / "printed.json"
    path.write_text(capsys.readouterr().out)
    loaded = load_config(path)
    assert loaded.hash == PRESETS[preset].hash
    assert loaded.name == preset


def test_a_file_names_its_base_preset(tmp_path: Path) -> None:
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"base": "tiny", "block_in": 8, "acc_buff_bytes": 8192}))
    config = load_config(path)
    tiny = PRESETS["tiny"]
    assert (config.block_in, config.block_out, config.acc_buff_bytes) == (8, tiny.block_out, 8192)
    assert config.inp_buff_bytes == tiny.inp_buff_bytes  # the rest is tiny's, not default's
    assert config.out_buff_bytes == config.acc_rows * config.out_row_bits // 8  # derived again
    assert config.name == "wide"


def test_a_file_without_a_base_starts_from_default() -> None:
    config = AcceleratorConfig.from_dict({"block_out": 8})
    assert config.hw_dict() == PRESETS["default"].replace(block_out=8).hw_dict()


@pytest.mark.parametrize("base", ["nope", 3, "tinyy"])
def test_an_unknown_base_names_the_presets(base: object) -> None:
    with pytest.raises(ConfigError, match=r"'base'.*presets: default, tiny"):
        AcceleratorConfig.from_dict({"base": base})


def test_describe_output_with_an_extra_key_is_refused() -> None:
    data = {**PRESETS["tiny"].describe(), "surprise": 1}
    with pytest.raises(ConfigError, match="surprise"):
        AcceleratorConfig.from_dict(data)


def test_an_impossible_design_point_names_the_buffers_and_the_sizes_that_fit() -> None:
    with pytest.raises(ConfigError) as caught:
        AcceleratorConfig.from_dict({"block_in": 8, "block_out": 8})
    message = str(caught.value)
    assert "GEMM instruction needs 132 bits" in message and "uop_end 13" in message
    assert "uop_buff_bytes=32768" in message  # today's sizes
    suggested = message.split("sizes that fit, changing one buffer: ")[1]
    fits = dict(item.split("=") for item in suggested.split(", "))
    assert set(fits) == {"uop_buff_bytes", "inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes"}
    for name, size in fits.items():  # each suggestion fits, and twice it does not
        config = AcceleratorConfig.from_dict({"block_in": 8, "block_out": 8, name: int(size)})
        assert getattr(config, name) == int(size)
        with pytest.raises(ConfigError, match="buffer sizes"):
            AcceleratorConfig.from_dict({"block_in": 8, "block_out": 8, name: 2 * int(size)})


def test_config_set_and_output_write_a_file_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "my.json"
    assert main(["config", "--preset", "tiny", "--set", "block_in=8", "--set", "acc_buff_bytes=8192",
                 "-o", str(out)]) == 0
    config = load_config(out)
    assert capsys.readouterr().out.strip() == f"wrote {out}: config 'my', hash {config.hash}"
    assert (config.name, config.block_in, config.acc_buff_bytes) == ("my", 8, 8192)
    assert config.hash == PRESETS["tiny"].replace(block_in=8, acc_buff_bytes=8192).hash
    assert config.inp_buff_bytes == PRESETS["tiny"].inp_buff_bytes


@pytest.mark.parametrize(("setting", "message"), [
    ("block_in", "--set takes FIELD=VALUE"),
    ("blok_in=8", "config field 'blok_in': unknown config field"),
    ("block_in=3", "config field 'block_in': must be a power of two"),
])
def test_config_set_errors_name_the_field(setting: str, message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "--set", setting, "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


def test_config_help_lists_every_preset(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["config", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"preset name ({', '.join(PRESETS)})" in text
