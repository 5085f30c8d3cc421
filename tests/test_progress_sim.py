"""Progress bars on long simulations: `weft run` per accelerator layer on fsim and rtl (layer name and
cycles so far), the cosimulation per job, and quiet when stderr is not a terminal."""

from __future__ import annotations

import io

import pytest

import weft
from weft.cli import main
from weft.progress import Progress
from weft.runtime.cli import follow_layers
from weft.sim.cosim import run_random

from .driver_util import compiled


def _follow_a_run(device: str, **options) -> tuple[Progress, str, weft.InferenceSession]:
    art, feeds = compiled("mlp")
    sess = weft.InferenceSession(art, device=device, **options)
    stream = io.StringIO()
    try:
        with Progress(len(sess.device.layers), f"run on {device}", stream=stream, enabled=True) as bar:
            follow_layers(sess.device, bar)
            sess.run(None, feeds)
    finally:
        close = getattr(sess.device, "close", None)
        if close is not None:
            close()
    return bar, stream.getvalue(), sess


def _check(bar: Progress, text: str, sess: weft.InferenceSession) -> None:
    accel = [layer for layer in sess.stats["layers"] if layer["target"] == "accel"]
    assert bar.done == bar.total == len(accel) > 1
    last = text.rstrip("\n").split("\r")[-1]
    total = sum(layer["cycles"] for layer in accel)
    assert f"[{'#' * 30}] {bar.total}/{bar.total}" in last
    assert last.rstrip().endswith(f"{accel[-1]['name']}, {total:,} cycles")


def test_weft_run_on_fsim_advances_per_layer_to_the_total():
    _check(*_follow_a_run("fsim"))


@pytest.mark.rtl
def test_weft_run_on_rtl_advances_per_layer_with_the_rtls_cycles():
    bar, text, sess = _follow_a_run("rtl")
    _check(bar, text, sess)
    assert sess.stats["cycles"] == sum(layer["cycles"] for layer in sess.stats["layers"] if layer["cycles"])


@pytest.mark.rtl
def test_cosim_advances_per_job():
    stream = io.StringIO()
    with Progress(2, "cosim", stream=stream, enabled=True) as bar:
        report = run_random(weft.load_config("tiny"), "verilator", [0, 1], n_insns=30, progress=bar)
    assert report.failed == 0
    assert bar.done == 2
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    assert "] 2/2 " in last and last.rstrip().endswith("seed 1")


def test_a_shorter_note_overwrites_a_longer_one():
    stream = io.StringIO()
    bar = Progress(2, "t", stream=stream, enabled=True)
    bar.advance(note="a long first note")
    bar.advance(note="short")
    first, second = stream.getvalue().split("\r")[1:]
    assert len(second) >= len(first) and second.rstrip().endswith("short")


def test_weft_run_is_quiet_when_stderr_is_not_a_terminal(tmp_path, capsys):
    art, _ = compiled("mlp")
    path = art.save(tmp_path / "m.weft")
    assert main(["run", str(path), "--device", "fsim"]) == 0
    assert "run on fsim" not in capsys.readouterr().err
