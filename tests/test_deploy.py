"""`weft deploy`: the folder imports and runs with numpy and the pynq stand-in only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weft.runtime import bitstreams
from weft.runtime.deploy import BLOCKED, deploy

from .driver_util import compiled

STANDIN = Path(__file__).parent / "fake_pynq"

#: Runs run.py with only the deploy folder and the stand-in importable besides numpy, heavy packages
#: blocked, and the development weft hidden (its editable finder is dropped).
_RUN = """
import importlib.abc, runpy, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError(name + " is blocked")
        return None
sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__.lower()]
sys.meta_path.insert(0, _Block())
sys.path[:0] = [{standin!r}]
assert runpy.run_path({run!r}, run_name='deployed')['main'](['--repeat', '2'] + {extra!r}) == 0
import weft
assert weft.__file__.startswith({out!r}), weft.__file__
print('RUNTIME', weft.__file__)
"""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    art, _ = compiled("mlp")
    root = tmp_path_factory.mktemp("bits")
    folder = bitstreams.write_project("pynq-z2", art.config, root, verilog="// stand-in")
    (folder / "weft.bit").write_bytes(b"bits")
    (folder / "weft.hwh").write_text("<hwh/>")
    bitstreams.record_build(folder)
    path = tmp_path_factory.mktemp("art") / "mlp.weft"
    art.save(path)
    out = tmp_path_factory.mktemp("deploy") / "board"
    info = deploy(path, "pynq-z2", out, bitstream_root=root)
    return out, info, art


def test_deploy_writes_the_board_folder(deployed):
    out, info, art = deployed
    assert info["bitstream"]
    for name in ("model.weft", "weft_spec.json", "run.py", "weft_run.ipynb", "README.txt", "bitstream/weft.bit",
                 "bitstream/manifest.json", "weft/__init__.py", "weft/runtime/driver.py",
                 "weft/runtime/pynq_device.py", "weft/runtime/safety.py", "weft/hw/regs.py"):
        assert (out / name).exists(), name
    assert not (out / "weft/hw/top.py").exists()  # the RTL generator (amaranth) stays home
    assert json.loads((out / "bitstream/manifest.json").read_text())["config_hash"] == art.config.hash
    assert json.loads((out / "weft_run.ipynb").read_text())["nbformat"] == 4


def _run(out: Path, extra: list[str]) -> subprocess.CompletedProcess:
    code = _RUN.format(blocked=BLOCKED, standin=str(STANDIN), extra=extra, run=str(out / "run.py"), out=str(out))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WEFT_PYNQ_BACKEND": "fsim",
                                                                       "WEFT_PYNQ_DRAM_BYTES": str(1 << 20)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=out,
                          env=env)


def test_deploy_folder_runs_with_numpy_and_the_standin_only(deployed):
    out, _, _ = deployed
    done = _run(out, [])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "latency" in done.stdout and "throughput" in done.stdout
    assert f"RUNTIME {out}" in done.stdout


def test_board_runtime_refuses_a_bitstream_of_another_config(deployed, tmp_path):
    from weft.config import PRESETS

    out, _, _ = deployed
    folder = bitstreams.write_project("pynq-z2", PRESETS["default"], tmp_path, verilog="//")
    (folder / "weft.bit").write_bytes(b"other")
    done = _run(out, ["--bitstream", str(folder / "weft.bit")])
    assert done.returncode != 0
    assert "config hash mismatch" in done.stderr


@pytest.mark.slow
def test_deploy_folder_runs_in_a_fresh_venv_with_numpy_only(deployed, tmp_path):
    """The issue's bar: a real virtual environment holding numpy alone, plus the pynq stand-in."""
    import venv

    out, _, _ = deployed
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "numpy"], capture_output=True, text=True,
                         timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(STANDIN), "WEFT_PYNQ_BACKEND": "fsim",
           "WEFT_PYNQ_DRAM_BYTES": str(1 << 20), "HOME": str(tmp_path)}
    for heavy in ("onnx", "amaranth", "cocotb", "llvmlite", "xgboost"):
        probe = subprocess.run([str(python), "-c", f"import {heavy}"], capture_output=True, env=env, timeout=60)
        assert probe.returncode != 0, f"{heavy} is importable in the fresh venv"
    done = subprocess.run([str(python), "run.py", "--repeat", "2"], capture_output=True, text=True, cwd=out,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "latency" in done.stdout and "throughput" in done.stdout
