"""The board-side packages import without the compiler's dependencies (pynq pins numpy<2 and an old
protobuf that onnx rejects, so the board cannot have onnx, llvmlite or xgboost)."""

from __future__ import annotations

import numpy as np

import weft
from weft.compiler import models

from .numpy_only import run_with_numpy_alone


def test_core_packages_import_with_numpy_alone():
    run_with_numpy_alone("""
        import weft, weft.config, weft.isa, weft.sim, weft.core, weft.runtime
        import weft.sim.fsim
        from weft.config import PRESETS
        from weft.isa import encode_insns, assemble
        encode_insns(PRESETS["default"], assemble("FINISH"))
        # amaranth is only needed to build hardware layouts, not to encode or simulate.
        assert "amaranth" not in sys.modules, sorted(m for m in sys.modules if m.startswith("amaranth"))
    """, timeout=60)


def test_artifact_runs_on_the_reference_device_without_onnx(tmp_path):
    """A board loads a .weft and runs it with numpy alone: the compiler's IR, layouts and integer
    kernels that the runtime uses must not pull in onnx."""
    model = models.small_resnet(widths=(8, 16, 24))
    rng = np.random.default_rng(0)
    art = weft.compile(model, calibration={"input": rng.standard_normal((2, 1, 3, 32, 32)).astype(np.float32)})
    path = art.save(tmp_path / "net.weft")
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = weft.InferenceSession(art).run(None, {"input": x})[0]
    np.save(tmp_path / "expected.npy", expected)
    run_with_numpy_alone(f"""
        import numpy as np
        import weft
        # Everything of the compiler but the ONNX importer and the driver works with numpy alone.
        import weft.compiler.pipeline, weft.compiler.quantize, weft.compiler.requant, weft.core.layout
        import weft.compiler.verify, weft.compiler.fusion, weft.compiler.passes, weft.compiler.calibrate
        sess = weft.InferenceSession({str(path)!r}, device="ref")
        out = sess.run(None, {{"input": np.load({str(tmp_path / "x.npy")!r})}})[0]
        assert np.array_equal(out, np.load({str(tmp_path / "expected.npy")!r}))
        assert sess.stats["accel_mac_fraction"] == 1.0
    """)
