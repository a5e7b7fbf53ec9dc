"""The old import path of the task contract's ``Workload`` (now ``xtrain.tasks.contract``),
kept because a custom task's builder (``model.custom``) written for it imports it from here."""

from xtrain.tasks.contract import Batch, EvalBatchFn, EvaluateFn, Prediction, ReduceFn, Workload

__all__ = ["Batch", "EvalBatchFn", "EvaluateFn", "Prediction", "ReduceFn", "Workload"]
