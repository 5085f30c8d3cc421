"""Schedule tuning of accelerator layers (AutoTVM-style): a search space from the back end's schedule knobs,
an XGBoost ranking cost model, a simulated-annealing explorer (random search as the baseline), measurers
(timing model, RTL) and a JSON-lines tuning log that later compiles reuse (``weft.compile(tuning_log=...)``).
"""

from weft.compiler.tune.log import TuningLog, best_schedules, workload_key
from weft.compiler.tune.tuner import tune_layer, tune_model

__all__ = ["TuningLog", "best_schedules", "tune_layer", "tune_model", "workload_key"]
