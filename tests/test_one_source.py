"""Each ISA fact is written in one module: the token queue names and the bytes of a memory row in
:mod:`weft.isa.semantics`, the bytes of an instruction in :mod:`weft.isa.constants`. Everything else derives
them, so a source file that spells one out again is a copy waiting to drift."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from weft.isa.semantics import QUEUES

ROOT = Path(__file__).resolve().parents[1]
#: Not the product's sources (tests, builds, environments).
SKIPPED = {"tests", "build", ".venv", ".git", "weft.egg-info"}


@cache
def _sources() -> list[tuple[str, ast.AST]]:
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(f for f in files if f.endswith(".py")):
            rel = (Path(folder) / name).relative_to(ROOT)
            out.append((rel.as_posix(), ast.parse((ROOT / rel).read_text(), str(rel))))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a queue)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _queue_name(node: ast.AST, docs: set[int]) -> bool:
    return isinstance(node, ast.Constant) and node.value in QUEUES and id(node) not in docs


def _bits_to_bytes(names: Callable[[str], bool]) -> Callable[[ast.AST, set[int]], bool]:
    """`<attribute or name> // 8` where the attribute or name satisfies `names`."""
    def match(node: ast.AST, docs: set[int]) -> bool:
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)
                and isinstance(node.right, ast.Constant) and node.right.value == 8):
            return False
        left = node.left
        name = left.attr if isinstance(left, ast.Attribute) else left.id if isinstance(left, ast.Name) else ""
        return names(name)
    return match


RULES = {
    "token queue name": (_queue_name, "isa/semantics.py"),
    "bytes of a memory row": (_bits_to_bytes(lambda n: n == "uop_bits" or n.endswith("_row_bits")),
                              "isa/semantics.py"),
    "bytes of an instruction": (_bits_to_bytes(lambda n: n.lower() == "insn_bits"), "isa/constants.py"),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_an_isa_fact_is_written_in_one_module(rule):
    match, home = RULES[rule]
    found: dict[str, list[int]] = {}
    for rel, tree in _sources():
        docs = _docstrings(tree)
        lines = [node.lineno for node in ast.walk(tree) if match(node, docs)]
        if lines:
            found[rel] = sorted(lines)
    assert set(found) == {home}, f"the {rule} is written outside {home}: {found}"


def test_the_rules_see_what_they_look_for():
    """Each rule matches the spelling it forbids, and not prose or other arithmetic."""
    tree = ast.parse('"""l2g in a docstring"""\nx = "g2s"\ny = c.out_row_bits // 8\nz = layout.insn_bits // 8\n'
                     "w = c.acc_rows * c.out_row_bits // 8\n")
    docs = _docstrings(tree)
    hits = {rule: [n.lineno for n in ast.walk(tree) if match(n, docs)] for rule, (match, _) in RULES.items()}
    assert hits == {"token queue name": [2], "bytes of a memory row": [3], "bytes of an instruction": [4]}
