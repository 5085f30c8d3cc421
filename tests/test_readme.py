"""The README, followed as a newcomer would: every shell and Python block, in order, in a fresh folder.

Shell blocks are the fenced ones labelled ``sh``, ``bash``, ``console`` or unlabelled; ``python`` blocks run
with this interpreter; ``json`` and ``text`` blocks are illustrations and not run. Each shell line is one
command, run by bash in a temporary folder with this checkout's ``.venv/bin`` first on PATH (what
``. .venv/bin/activate`` does) and ``examples/`` copied in (the README's commands run from the checkout's
root). ``make`` lines are the set-up this test already runs inside: they are checked with ``make -n``.

A command that needs hardware a CI machine lacks says so in the README with a trailing ``# needs: board``
(or ``gpu``, ``vivado``); it is listed as skipped with that reason, and nothing else is skipped. The
default suite runs every command but the long ones (:data:`LONG`, with the commands that read their
outputs); ``-m slow`` runs the README whole.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

SHELL = {"", "sh", "bash", "console"}
NOT_RUN = {"json", "text"}
#: What a `# needs: X` mark may name: hardware a CI machine does not have.
HARDWARE = {"board", "gpu", "vivado"}

#: Commands (by prefix) that take more than a few seconds: the default suite leaves them, and those reading
#: their outputs, to the slow test, and keeps to about a minute.
LONG = (
    "weft demo",
    "weft bench ",
    "weft tune ",
    "weft dse ",
    "weft synth ",
    "weft cosim ",
    "weft rtl ",
    "weft bitstream --board",  # generates the design's Verilog
    "weft run resnet18.weft --device rtl",  # builds and runs the design on Verilator
    "weft run resnet18.weft --device fsim",
    "weft run small.weft --device rtl",  # builds the design with Verilator
    "weft report ",
    "weft compile resnet18.onnx -o tuned.weft",  # reads tune.jsonl
    "weft run r18cpu.weft --device cpu --device-option threads=2 --device-option tuning_log=",  # reads cpu.jsonl
)

_FENCE = re.compile(r"^```(\w*)\s*$")
_NEEDS = re.compile(r"#\s*needs:\s*(\w+)")


@dataclass(frozen=True)
class Step:
    kind: str  # "shell" or "python"
    text: str
    line: int  # of README.md, for the failure message
    needs: str | None = None


def readme_steps() -> list[Step]:
    """Every runnable command of README.md, in order."""
    steps: list[Step] = []
    lines = README.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = start
        while not lines[end].startswith("```"):
            end += 1
        body = lines[start:end]
        i = end + 1
        if lang in NOT_RUN:
            continue
        if lang == "python":
            steps.append(Step("python", "\n".join(body), start + 1))
            continue
        assert lang in SHELL, f"README.md:{start}: a block labelled '{lang}' is neither run nor marked as text"
        for n, raw in enumerate(body):
            command = raw.strip()
            if not command or command.startswith("#"):
                continue
            needs = _NEEDS.search(command)
            steps.append(Step("shell", command, start + n + 1, needs.group(1) if needs else None))
    return steps


def _is_long(step: Step) -> bool:
    return step.kind == "shell" and step.text.startswith(LONG)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env.pop("PYTHONPATH", None)
    return env


def _make_targets(command: str) -> list[str]:
    words = command.split("#")[0].split("&&")[0].split()
    return words[1:]


def _run(step: Step, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    if step.kind == "python":
        args = [sys.executable, "-c", step.text]
    elif step.text.startswith("make "):
        # The set-up this test runs inside: the targets must exist (a dry run), not be run again.
        return subprocess.run(["make", "-n", "-C", str(ROOT), *_make_targets(step.text)], capture_output=True,
                              text=True, timeout=60)
    else:
        args = ["bash", "-e", "-o", "pipefail", "-c", step.text]
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _blocks(lang: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _follow(tmp_path: Path, *, long: bool) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    skipped: list[str] = []
    for step in readme_steps():
        if step.needs is not None:
            assert step.needs in HARDWARE, (f"README.md:{step.line}: '# needs: {step.needs}' is not hardware "
                                            f"({', '.join(sorted(HARDWARE))}); only those may be skipped")
            skipped.append(f"README.md:{step.line}: {step.text}  [needs {step.needs}]")
            continue
        if _is_long(step) and not long:
            skipped.append(f"README.md:{step.line}: {step.text}  [long: the slow test runs it]")
            continue
        start = time.monotonic()
        result = _run(step, tmp_path, timeout=3600 if long else 300)
        print(f"README.md:{step.line}: {time.monotonic() - start:6.1f} s  {step.text.splitlines()[0]}")
        assert result.returncode == 0, (f"README.md:{step.line}: exit {result.returncode}\n{step.text}\n"
                                        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    print("skipped:\n" + "\n".join(skipped))


def test_readme_blocks_are_all_understood() -> None:
    steps = readme_steps()
    assert any(s.kind == "python" for s in steps) and any(s.text.startswith("weft ") for s in steps)
    for step in steps:
        assert step.needs is None or step.needs in HARDWARE, f"README.md:{step.line}: unknown mark '{step.needs}'"
        assert "[" not in step.text.split("#")[0] or step.kind == "python", \
            f"README.md:{step.line}: optional arguments in brackets do not run: {step.text}"


def test_readme_fast_commands(tmp_path: Path) -> None:
    _follow(tmp_path, long=False)


@pytest.mark.slow
def test_readme_whole(tmp_path: Path) -> None:
    _follow(tmp_path, long=True)


def test_readme_lists_the_models() -> None:
    from weft.compiler.models import MODELS

    text = README.read_text(encoding="utf-8")
    missing = [name for name in MODELS if f"`{name}`" not in text]
    assert not missing, f"README.md does not name the built-in models {missing}"


def test_readme_lists_every_imported_op() -> None:
    from weft.compiler.onnx_import import SUPPORTED_OPS

    lists = [b for b in _blocks("text") if "Conv, " in b]
    assert len(lists) == 1, "README.md: the op list is one ```text block"
    assert set(lists[0].replace(",", " ").split()) == set(SUPPORTED_OPS)


def test_readme_config_examples_load(tmp_path: Path) -> None:
    from weft.config import load_config

    for n, block in enumerate(_blocks("json")):
        path = tmp_path / f"example{n}.json"
        path.write_text(block, encoding="utf-8")
        load_config(str(path))
