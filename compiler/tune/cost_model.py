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

    def fit(self, x: np.ndarray, cycles: np.ndarray) -> None:
        import xgboost as xgb

        if len(x) < 2:
            return
        # Relevance: higher for fewer cycles, normalised by the best seen so the labels are scale free.
        y = np.min(cycles) / np.asarray(cycles, dtype=np.float64)
        data = xgb.DMatrix(x, label=y)
        data.set_group([len(x)])
        params = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.3, "min_child_weight": 1,
                  "subsample": 1.0, "seed": self.seed, "nthread": 1, "verbosity": 0}
        self._booster = xgb.train(params, data, num_boost_round=self.rounds)

    def predict(self, x: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        if self._booster is None:
            raise RuntimeError("the cost model predicts only after fit() saw at least two measurements")
        return self._booster.predict(xgb.DMatrix(x))
