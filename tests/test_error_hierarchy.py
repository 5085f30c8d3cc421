"""One error hierarchy: a user's mistake is a WeftError printed as one line; anything else is a bug in weft
and shows its traceback."""

from __future__ import annotations

import ast
import builtins
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from weft.cli import main
from weft.compiler import models
from weft.compiler.llvm.emit import EmitError
from weft.compiler.llvm.schedule import ScheduleError
from weft.config import ConfigError
from weft.errors import UsageError, UserFileError, WeftError, is_user_error
from weft.isa.asm import AsmError
from weft.isa.encoding import EncodeError
from weft.runtime.bounded import LimitError
from weft.tools.board_measurer import BoardTimeout

ROOT = Path(__file__).resolve().parents[1]

#: Exception classes of weft that are not WeftErrors, and why: none of them reaches a user as the answer
#: to their input.
INTERNAL = {
    "InterpreterError": "the loop-IR interpreter's verdict on a lowered kernel: a bug in lowering, which it tests",
    "EpilogueOverflow": "caught by the quantizer, which then keeps the layer on the host",
    "_Overflow": "private to the quantizer, caught there",
    "_HttpError": "private to the remote server, sent to the client as an HTTP status",
}


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.save(models.MODELS["mlp"](), tmp_path_factory.mktemp("model") / "mlp.onnx")


def _one_line(capsys: pytest.CaptureFixture[str], command: str, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"weft {command}: error: "), err
    for fragment in fragments:
        assert fragment in err, err


# ---- a bug shows its traceback ---------------------------------------------------------------------------
_BROKEN_COMPILE = """
import sys
from weft.compiler.backend import memory

def broken(*args, **kwargs):
    return [][0]  # an IndexError deep in the back end, as a bug would raise it

memory.DramPlan.constant = broken
from weft.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_internal_error_in_the_back_end_shows_its_traceback(mlp_file, tmp_path):
    out = tmp_path / "mlp.weft"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BROKEN_COMPILE), "compile", str(mlp_file),
                           "-o", str(out), "--config", "tiny"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "IndexError" in proc.stderr, proc.stderr
    assert "in broken" in proc.stderr  # the frame of the bug itself, not only the command line's
    assert not out.exists()


def test_an_internal_error_reaches_the_caller_of_main(monkeypatch, mlp_file, tmp_path):
    from weft.compiler.backend import memory

    def broken(*args: object, **kwargs: object) -> int:
        raise IndexError("a bug")

    monkeypatch.setattr(memory.DramPlan, "constant", broken)
    with pytest.raises(IndexError, match="a bug"):
        main(["compile", str(mlp_file), "-o", str(tmp_path / "mlp.weft"), "--config", "tiny"])


# ---- a user's mistake is one line ------------------------------------------------------------------------
def test_a_bad_config_field_is_one_line(mlp_file, tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"block_in": 12}))
    assert main(["compile", str(mlp_file), "-o", str(tmp_path / "m.weft"), "--config", str(cfg)]) == 2
    _one_line(capsys, "compile", "config field 'block_in'")


def test_a_missing_model_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.onnx"
    assert main(["compile", str(missing), "-o", str(tmp_path / "m.weft")]) == 2
    _one_line(capsys, "compile", str(missing))


def test_a_model_that_is_a_folder_is_one_line(tmp_path, capsys):
    assert main(["dse", str(tmp_path), "--sweep", "block_in=16"]) == 2
    _one_line(capsys, "dse", f"model {tmp_path}")


def test_an_unreadable_asm_input_is_one_line(tmp_path, capsys):
    assert main(["asm", str(tmp_path)]) == 2
    _one_line(capsys, "asm", f"input {tmp_path}")


def test_bad_asm_is_one_line(tmp_path, capsys):
    src = tmp_path / "p.s"
    src.write_text("FINISH\nFROB inp\n")
    assert main(["asm", str(src)]) == 2
    _one_line(capsys, "asm", str(src), "line 2")


def test_a_bad_option_is_one_line(capsys):
    assert main(["cosim", "--count", "0"]) == 2
    _one_line(capsys, "cosim", "--count")


def test_an_unwritable_output_is_one_line(tmp_path, capsys):
    out = tmp_path / "missing" / "spec.h"
    assert main(["isa", "--format", "c", "-o", str(out)]) == 2
    _one_line(capsys, "isa", f"output {out}")


def test_a_device_option_the_device_needs_is_named():
    from weft.config import PRESETS
    from weft.runtime.devices import DeviceError, create_device

    with pytest.raises(DeviceError, match="device 'remote' needs the option 'target'"):
        create_device("remote", PRESETS["tiny"])


# ---- what counts as the user's fault ---------------------------------------------------------------------
@pytest.mark.parametrize("err", [ValueError("x"), KeyError("x"), OSError("x"), FileNotFoundError("x"),
                                 TypeError("x"), IndexError("x"), RuntimeError("x")])
def test_builtin_errors_are_bugs(err):
    assert not is_user_error(err)


@pytest.mark.parametrize("cls", [ConfigError, AsmError, EncodeError, ScheduleError, EmitError, LimitError,
                                 BoardTimeout, UsageError])
def test_value_errors_users_catch_are_weft_errors_too(cls):
    # Callers catch these as ValueError today; that stays, and the command line still judges by WeftError.
    assert issubclass(cls, WeftError) and issubclass(cls, ValueError)


def test_an_unreadable_file_names_it_and_keeps_the_cause(tmp_path):
    from weft.errors import read_input

    with pytest.raises(UserFileError, match=r"^model .*nope\.onnx: No such file or directory$") as info:
        read_input(tmp_path / "nope.onnx", "model")
    assert info.value.path == str(tmp_path / "nope.onnx")
    assert isinstance(info.value.__cause__, FileNotFoundError)


# ---- every exception class of weft is a WeftError, or listed above as internal ---------------------------
def _sources() -> list[Path]:
    skip = {"tests", ".venv", "build", "sim_build"}
    return [p for p in sorted(ROOT.rglob("*.py")) if not skip & set(p.relative_to(ROOT).parts[:-1])]


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def test_every_exception_class_is_a_weft_error_or_listed_as_internal():
    bases: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.name not in where or not node.name.endswith("Error"), \
                    f"two exception classes named {node.name}: {where[node.name]} and {path}"
                bases[node.name] = [_base_name(b) for b in node.bases]
                where[node.name] = str(path.relative_to(ROOT))

    def ancestors(name: str) -> set[str]:
        out: set[str] = set()
        for b in bases.get(name, []):
            out |= {b} | ancestors(b)
        return out

    def builtin_exception(name: str) -> type | None:
        cls = getattr(builtins, name, None)
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None

    found = {}
    for name in bases:
        up = ancestors(name)
        kinds = [c for c in map(builtin_exception, up) if c is not None]
        if not kinds or any(issubclass(c, Warning) for c in kinds):
            continue  # not an exception class, or a warning
        found[name] = "WeftError" in up or name == "WeftError"
    assert {"ConfigError", "CompileError", "AsmError", "LaunchError"} <= set(found)
    unlisted = sorted(f"{name} ({where[name]})" for name, ok in found.items() if not ok and name not in INTERNAL)
    assert not unlisted, f"exception classes neither WeftError nor listed as internal: {unlisted}"
    stale = sorted(name for name in INTERNAL if found.get(name, True))
    assert not stale, f"listed as internal but gone or now a WeftError: {stale}"
