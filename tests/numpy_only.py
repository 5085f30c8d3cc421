"""Run code in a fresh interpreter where the compiler's dependencies (onnx, llvmlite, ...) cannot be
imported, as on a board."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: Prepended to the code: a finder that refuses the compiler's dependencies (and cocotb, sklearn).
BLOCKER = textwrap.dedent("""
    import sys
    BLOCKED = {"onnx", "onnxruntime", "llvmlite", "xgboost", "google.protobuf", "cocotb", "sklearn"}
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED or name in BLOCKED:
                raise ImportError(f"blocked import of {name}")
            return None
    sys.meta_path.insert(0, Blocker())
""")

#: Appended to the code: an import of onnx by the way (even one that is caught) fails the run.
_NO_LEAK = textwrap.dedent("""
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnxruntime", "google"))
    assert not leaked, leaked
    print("ok")
""")


def run_with_numpy_alone(code: str, timeout: float = 120) -> None:
    """Run `code` (dedented) with the compiler's dependencies blocked; it must succeed and import none."""
    script = BLOCKER + textwrap.dedent(code) + _NO_LEAK
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
