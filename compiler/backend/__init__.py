"""The accelerator back end: tiling, tensorization onto the GEMM intrinsic, latency hiding with virtual
threads, and one checked instruction stream per accelerator layer, plus the DRAM image they run on.

    from weft.compiler.backend import generate, Schedule
    generate(artifact)                          # adds the artifact's "accel" section
    generate(artifact, latency_hiding=False)    # one virtual thread per layer, same tiles
    generate(artifact, schedules={"conv1": Schedule(tile_h=8, tile_w=14, tile_oc=4)})

Modules, one job each: :mod:`te` (loop nests and schedule primitives), :mod:`schedule` (knobs, search
space, default choice), :mod:`conv` and :mod:`pool` (layer lowerings on :mod:`tiles`), :mod:`alu`
(epilogues), :mod:`dma` (2-D transfers with padding), :mod:`memory` (the DRAM image), :mod:`vthread`
(dependency tokens), :mod:`check` (static checks), :mod:`codegen` (the driver). Imports with numpy alone.
"""

from weft.compiler.backend.check import StreamError, check_stream
from weft.compiler.backend.codegen import BackendError, generate, layer_geometry
from weft.compiler.backend.schedule import LayerGeom, Schedule, default_schedule, space

__all__ = [
    "BackendError", "LayerGeom", "Schedule", "StreamError", "check_stream", "default_schedule", "generate",
    "layer_geometry", "space",
]
