"""Imports flow one way, down these layers: no package imports one above it or beside it, so no import
needs to hide inside a function to dodge a cycle.

    weft.errors, weft.progress    (the root's utilities)
    weft.isa         the instruction set: constants, layouts from a config's numbers, semantics, encoding
    weft.config      the design point, checked against the ISA it must fit
    weft.core        what the compiler and the runtime share: IR, kernels, artifact, graph walker
    weft.cli_common  the --config option (it lists the presets) and JSON output of every command module
    weft.hw
    weft.sim
    weft.compiler    weft.runtime        (neither imports the other)
    weft.tools, weft.cli, weft.commands, weft.demo    (compile and run: above both)

``import weft`` loads the config (and so the ISA), so the layers up to the config are checked apart from that.
The core's integer kernels take the ISA's bit arithmetic (wrap, exact float dtypes) from :mod:`weft.isa.arith`,
as the simulator does, so the core needs neither the hardware nor the simulator.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Bottom to top; a name is a root module or a package (all its modules); names joined by "+" are one unit.
LAYERS: list[tuple[str, ...]] = [
    ("weft.errors", "weft.progress"),
    ("weft.isa",),
    ("weft.config",),
    ("weft.core", "weft.cli_common"),
    ("weft.hw",),
    ("weft.sim",),
    ("weft.compiler", "weft.runtime"),
    ("weft.tools", "weft.cli", "weft.commands", "weft.demo"),
]
#: The runtime's one way into the compiler: the cpu and cuda devices build host code with
#: weft.compiler.llvm, imported when such a device is made (llvmlite is optional on a board).
RUNTIME_TO_COMPILER = {("runtime/cpu_device.py", "weft.compiler.llvm.graph"),
                       ("runtime/cpu_device.py", "weft.compiler.llvm.cuda")}


def _unit(module: str) -> str | None:
    """The layer entry `module` belongs to (None for the bare ``weft`` package)."""
    for layer in LAYERS:
        for unit in layer:
            if any(module == name or module.startswith(name + ".") for name in unit.split("+")):
                return unit
    return None


def _level(unit: str) -> int:
    return next(k for k, layer in enumerate(LAYERS) if unit in layer)


def _modules(unit: str) -> list[str]:
    """Every module of `unit`: root modules as named, every module of a package (cocotb test benches aside)."""
    out = []
    for name in unit.split("+"):
        path = ROOT / name.removeprefix("weft.").replace(".", "/")
        if not path.is_dir():
            out.append(name)
            continue
        for file in sorted(path.rglob("*.py")):
            rel = file.relative_to(ROOT).with_suffix("")
            if "cocotb_tb" not in rel.parts:
                out.append(".".join(("weft", *(rel.parts[:-1] if rel.name == "__init__" else rel.parts))))
    return out


def _loaded(modules: list[str]) -> list[str]:
    """The weft modules a fresh interpreter holds after importing `modules`."""
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {modules!r}:
            importlib.import_module(name)
        print("\\n".join(m for m in sys.modules if m.startswith("weft.")))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("unit", [unit for layer in LAYERS for unit in layer])
def test_a_fresh_import_loads_nothing_above_or_beside(unit: str) -> None:
    """Import every module of `unit` in a fresh interpreter: no module of a higher layer, or of another
    entry of the same layer, may be loaded."""
    level = _level(unit)
    baseline = set(_loaded(["weft"])) if level <= _level("weft.config") else set()  # what `import weft` loads
    loaded = set(_loaded(_modules(unit))) - baseline
    wrong = sorted(m for m in loaded if (u := _unit(m)) is not None and u != unit and _level(u) >= level)
    assert not wrong, f"importing {unit} loaded {wrong}"


def _imports(file: Path) -> list[tuple[str, int]]:
    """Every weft module `file` imports, at any depth (inside functions too), with its line; imports for type
    annotations alone (under ``if TYPE_CHECKING:``) never run, so they are no dependency."""
    tree = ast.parse(file.read_text())
    package = ".".join(("weft", *file.relative_to(ROOT).parent.parts))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("weft")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("weft"):
                out += [(name, node.lineno)]
    return out


def _files(folder: str) -> list[Path]:
    return sorted(f for f in (ROOT / folder).rglob("*.py") if "cocotb_tb" not in f.parts)


def test_compiler_never_imports_runtime_or_above() -> None:
    bad = [f"{f.relative_to(ROOT)}:{line} imports {name}" for f in _files("compiler") for name, line in _imports(f)
           if _unit(name) in ("weft.runtime", "weft.tools", "weft.cli", "weft.commands", "weft.demo")]
    assert not bad, "\n".join(bad)


def test_runtime_reaches_the_compiler_only_for_its_host_code_devices() -> None:
    bad = [f"{f.relative_to(ROOT)}:{line} imports {name}" for f in _files("runtime") for name, line in _imports(f)
           if _unit(name) in ("weft.compiler", "weft.tools", "weft.cli", "weft.commands", "weft.demo")
           and (str(f.relative_to(ROOT)), name) not in RUNTIME_TO_COMPILER]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["core", "isa"])
def test_core_and_isa_import_nothing_above_them(folder: str) -> None:
    """Function-level imports included: a lazy import is still a dependency."""
    own = _unit(f"weft.{folder}")
    assert own is not None
    bad = [f"{f.relative_to(ROOT)}:{line} imports {name}" for f in _files(folder) for name, line in _imports(f)
           if (u := _unit(name)) is not None and u != own and _level(u) >= _level(own)]
    assert not bad, "\n".join(bad)
