"""The cost model: XGBoost gradient-boosted trees with a pairwise ranking objective (as AutoTVM's
``xgboost_cost_model.py``): the explorer only needs the order of schedules, and ranks transfer across
layers of very different sizes where absolute cycles do not."""

from __future__ import annotations

import numpy as np

__all__ = ["XGBCostModel"]


class XGBCostModel:
    """``fit(features, cycles)``, then ``predict(features)``: higher scores mean fewer cycles."""

    def __init__(self, seed: int = 0, rounds: int = 80) -> None:
        self.seed = seed
        self.rounds = rounds
        self._booster = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(self, x: np.ndarray, cycles: np.ndarray, groups: list[int] | None = None) -> None:
        """Learn the order of `cycles` within each group (consecutive rows; one group when None): the rows
        of one workload form a group, so other workloads' measurements (transfer learning) teach which
        features make a schedule fast without mixing their scales."""
        import xgboost as xgb

        if len(x) < 2:
            return
        cycles = np.asarray(cycles, dtype=np.float64)
        groups = [len(x)] if groups is None else list(groups)
        if sum(groups) != len(x):
            raise ValueError(f"groups cover {sum(groups)} rows, the data has {len(x)}")
        # Relevance: higher for fewer cycles, normalised by the group's best so the labels are scale free.
        y = np.empty_like(cycles)
        start = 0
        for n in groups:
            y[start:start + n] = np.min(cycles[start:start + n]) / cycles[start:start + n]
            start += n
        data = xgb.DMatrix(x, label=y)
        data.set_group(groups)
        params = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.3, "min_child_weight": 1,
                  "subsample": 1.0, "seed": self.seed, "nthread": 1, "verbosity": 0}
        self._booster = xgb.train(params, data, num_boost_round=self.rounds)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self._booster is None:
            raise RuntimeError("the cost model predicts only after fit() saw at least two measurements")
        # In place: no DMatrix per call (the explorer predicts thousands of small batches; ~9x faster).
        return np.asarray(self._booster.inplace_predict(np.asarray(x, dtype=np.float64)))
