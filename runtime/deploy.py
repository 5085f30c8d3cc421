"""``weft deploy OUT.weft --board B -o DIR``: everything a board needs to run an artifact.

DIR gets the artifact (``model.weft``), the register spec (``weft_spec.json``, as ``weft rtl``
writes it), the board runtime (``weft/``: the modules the runtime, the
driver and the PYNQ device import, copied from this weft; they import with numpy and pynq only, no onnx,
llvmlite, xgboost, amaranth or cocotb), ``run.py`` (loads the bitstream, runs the model on given or
random inputs, prints latency and throughput), ``weft_run.ipynb`` (the same in a notebook), the
bitstream with its manifest when ``weft bitstream`` has a built one for the board and config
(``bitstream/``), and a README. The runtime refuses a bitstream whose config hash differs from the
artifact's (the manifest, then the CONFIG_HASH registers).

``weft/`` is built in a staging folder beside it and swapped in; an existing ``weft/`` is replaced only
when it holds the marker file a previous deploy left (``.weft-deploy``), so ``-o ~`` cannot delete a
``~/weft`` that deploy did not write. Likewise DIR's other files (``run.py``, ``README.txt``...) are
overwritten only in a DIR whose marker says deploy wrote them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from weft.core.artifact import load_artifact
from weft.errors import WeftError, user_file
from weft.hw.regs import registers_spec
from weft.isa import isa_spec
from weft.runtime.bitstreams import BitstreamError, board_of, check_board_fit, lookup

__all__ = ["BLOCKED", "MARKER", "DeployError", "add_deploy_arguments", "board_modules", "deploy", "run_deploy"]

#: The file inside a ``weft/`` folder that deploy wrote; only such a folder is ever replaced.
MARKER = ".weft-deploy"
#: What deploy writes in DIR: in a DIR without the marker, none of them may exist already.
OWN_NAMES = ("model.weft", "weft", "weft_spec.json", "run.py", "weft_run.ipynb", "README.txt", "bitstream")


class DeployError(WeftError):
    """The deploy folder cannot be written without destroying something deploy did not make."""

#: Packages the board runtime must not need.
BLOCKED = ("onnx", "onnxruntime", "llvmlite", "xgboost", "amaranth", "cocotb", "cocotbext", "scipy", "torch")
#: What the board imports; the file list is what these pull in.
ENTRY_MODULES = ("weft.runtime", "weft.runtime.pynq_device", "weft.runtime.driver", "weft.runtime.bitstreams",
                 "weft.runtime.remote", "weft.core.walker", "weft.core.host", "weft.runtime.dram_runner")

_BLOCKER = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not available on the board")
        return None
sys.meta_path.insert(0, _Block())
"""

_LIST = _BLOCKER + """
import importlib, json
for name in {entries!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()
                        if n == "weft" or n.startswith("weft.") and getattr(m, "__file__", None))))
"""


def board_modules() -> list[Path]:
    """Source files of the weft modules the board runtime imports (found in a fresh interpreter with the
    blocked packages unimportable, so a heavy import fails here rather than on the board)."""
    code = _LIST.format(blocked=BLOCKED, entries=ENTRY_MODULES)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"the board runtime does not import without {', '.join(BLOCKED)}:\n{done.stderr[-2000:]}")
    return [Path(p) for p in json.loads(done.stdout.strip().splitlines()[-1])]


RUN_PY = '''"""Run the deployed model on this board: python run.py [--bitstream bitstream/weft.bit]
[--input NAME=FILE.npy]
[--repeat N]. Prints outputs, latency and throughput."""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv=None):
    sys.path.insert(0, str(HERE))  # the bundled runtime
    from weft.runtime import InferenceSession

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bitstream", default=str(HERE / "bitstream" / "weft.bit"))
    parser.add_argument("--device", default="pynq", help="pynq (default), or fsim to check without a board")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # register offsets from the generated spec (weft rtl's weft_spec.json), not from the runtime's tables
    options = {"bitstream": args.bitstream, "spec": str(HERE / "weft_spec.json")} if args.device == "pynq" else {}
    sess = InferenceSession(str(HERE / "model.weft"), device=args.device, **options)
    feeds = {}
    for text in args.input:
        name, _, path = text.partition("=")
        feeds[name] = np.load(path, allow_pickle=False)
    rng = np.random.default_rng(args.seed)
    for arg in sess.get_inputs():
        if arg.name not in feeds:
            feeds[arg.name] = rng.standard_normal(arg.shape).astype(np.float32)
    outputs = sess.run(None, feeds)  # the first run also allocates buffers
    times = []
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        outputs = sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    for arg, value in zip(sess.get_outputs(), outputs):
        flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
        print(f"output '{arg.name}': {list(value.shape)}, argmax {flat.argmax(axis=1).tolist()}")
    batch = next(iter(feeds.values())).shape[0]
    latency = float(np.median(times))
    print(f"latency {latency * 1e3:.3f} ms (median of {len(times)}), throughput {batch / latency:.1f} inferences/s")
    stats = sess.stats or {}
    if stats.get("cycles") is not None:  # None on devices that do not count cycles (fsim without timing, cpu)
        print(f"accelerator cycles {stats['cycles']:,}")
    else:
        print(f"cycles: n/a (device {args.device} does not count accelerator cycles)")
    close = getattr(sess.device, "close", None)
    if close is not None:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _notebook() -> dict[str, Any]:
    cells = [
        ("markdown", "# weft on the board\nLoads the bitstream, runs the deployed model, prints latency and "
                     "throughput. The runtime refuses a bitstream built for another config."),
        ("code", "import run\nrun.main(['--repeat', '10'])"),
    ]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3",
                                                                             "display_name": "Python 3"}},
            "cells": [{"cell_type": kind, "metadata": {}, "source": text,
                       **({"outputs": [], "execution_count": None} if kind == "code" else {}), "id": f"c{k}"}
                      for k, (kind, text) in enumerate(cells)]}


def deploy(artifact_path: str | Path, board: str, out: str | Path, *, bitstream_root: str | Path | None = None
           ) -> dict[str, Any]:
    """Write the deploy folder; returns what went in it."""
    board_of(board)
    art = load_artifact(artifact_path)
    out = Path(out)
    target = out / "weft"
    _check_replaceable(out, target)
    files = board_modules()
    with user_file(out, "output folder"):
        out.mkdir(parents=True, exist_ok=True)
    # first: a deploy that fails halfway can be run again over what it left
    (out / MARKER).write_text("written by weft deploy; the next deploy overwrites its files in this folder\n")
    _install_runtime(files, target)
    shutil.copyfile(artifact_path, out / "model.weft")

    spec = isa_spec(art.config, registers=registers_spec(art.config))  # what `weft rtl` writes
    (out / "weft_spec.json").write_text(json.dumps(spec, indent=1))
    (out / "run.py").write_text(RUN_PY)
    (out / "weft_run.ipynb").write_text(json.dumps(_notebook(), indent=1))
    bit_note = ""
    try:
        folder, manifest = lookup(board, art.config, bitstream_root)
        (out / "bitstream").mkdir(exist_ok=True)
        for name in (manifest["bit"]["name"], manifest["hwh"]["name"], "manifest.json"):
            shutil.copyfile(folder / name, out / "bitstream" / name)
        bit_note = f"bitstream/ holds the {board} bitstream of config {art.config.name} ({art.config.hash})."
    except BitstreamError as err:
        bit_note = (f"No built bitstream was found ({err}). Put weft.bit, weft.hwh and manifest.json for board "
                    f"{board} and config hash {art.config.hash} in bitstream/ (weft bitstream --board {board}).")
    (out / "README.txt").write_text(
        f"weft deployment of {Path(artifact_path).name} for {board} (config {art.config.name}, hash "
        f"{art.config.hash}).\n{bit_note}\nOn the board: python3 run.py (needs numpy and pynq 3.x only); "
        "or open weft_run.ipynb in Jupyter.\n")
    return {"files": len(files), "board": board, "bitstream": (out / "bitstream" / "weft.bit").exists()}


def _check_replaceable(out: Path, target: Path) -> None:
    """Refuse before writing anything when `target` (DIR/weft) or, in a DIR that deploy did not write,
    any of the names deploy writes already exists."""
    if target.is_symlink() or (target.exists() and not (target / MARKER).is_file()):
        raise DeployError(f"{target} exists and was not written by weft deploy (no {MARKER} in it): "
                          "move it away or deploy to another folder")
    if not (out / MARKER).is_file():
        for name in OWN_NAMES:
            if (out / name).exists() or (out / name).is_symlink():
                raise DeployError(f"{out / name} exists and {out} was not written by weft deploy (no {MARKER} in "
                                  "it): move it away or deploy to another folder")


def _install_runtime(files: list[Path], target: Path) -> None:
    """Copy the board runtime into a staging folder beside `target`, then swap it in."""
    package_root = Path(__file__).resolve().parent.parent
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    staging = target.parent / f".weft-staging.{token}"
    try:
        for path in files:
            dest = staging / path.relative_to(package_root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        for folder in sorted({p.parent for p in staging.rglob("*.py")}):
            (folder / "__init__.py").touch()
        (staging / MARKER).write_text("written by weft deploy; the next deploy replaces this folder\n")
        if target.exists():
            old = target.parent / f".weft-old.{token}"
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old)
        else:
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def add_deploy_arguments(parser: Any) -> None:
    parser.add_argument("artifact", help="a .weft file compiled for the accelerator")
    parser.add_argument("--board", required=True, help="target board (pynq-z1, pynq-z2, ultra96-v2, zcu104, kv260)")
    parser.add_argument("-o", "--output", required=True, help="folder to write")
    parser.add_argument("--bitstreams", default=None,
                        help="folder of bitstream projects (default: ./bitstreams, then those shipped with weft)")
    parser.add_argument("--force", action="store_true",
                        help="deploy even when the artifact's config does not fit the board's FPGA")


def run_deploy(args: Any) -> int:
    board_of(args.board)  # an unknown board is the first thing to say
    warning = check_board_fit(args.board, load_artifact(args.artifact).config, force=args.force)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    info = deploy(args.artifact, args.board, args.output, bitstream_root=args.bitstreams)
    print(f"wrote {args.output}: model.weft, run.py, weft_run.ipynb, board runtime ({info['files']} modules), "
          f"bitstream {'included' if info['bitstream'] else 'missing (see README.txt)'}")
    return 0
