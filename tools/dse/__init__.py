"""Design-space exploration: sweep accelerator configs, measure cycles (timing model) and area (Yosys).

- :mod:`.knobs`: the sweep grammar (``block=8,16,32``) and the grid of configs it spans;
- :mod:`.sweep`: evaluating one design point and running a grid on a process pool or a Dask cluster;
- :mod:`.pareto`: the Pareto front of latency against resources, CSV and plot;
- :mod:`.cli`: ``weft dse``.
"""

from weft.tools.dse.knobs import KNOBS, expand_grid, parse_sweep
from weft.tools.dse.pareto import pareto_front
from weft.tools.dse.sweep import evaluate_point, run_sweep

__all__ = ["KNOBS", "evaluate_point", "expand_grid", "pareto_front", "parse_sweep", "run_sweep"]
