"""The board-side packages import without the compiler's dependencies (pynq pins numpy<2 and an old
protobuf that onnx rejects, so the board cannot have onnx, llvmlite or xgboost)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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


def test_core_packages_import_with_numpy_alone():
    code = BLOCKER + textwrap.dedent("""
        import weft, weft.config, weft.isa, weft.sim, weft.runtime
        import weft.sim.fsim
        from weft.config import PRESETS
        from weft.isa import encode_insns, assemble
        encode_insns(PRESETS["default"], assemble("FINISH"))
        # amaranth is only needed to build hardware layouts, not to encode or simulate.
        assert "amaranth" not in sys.modules, sorted(m for m in sys.modules if m.startswith("amaranth"))
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
