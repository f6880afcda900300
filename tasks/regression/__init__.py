"""Text and text-pair regression: the task, its target statistics and its report."""

from bertkit_tasks.regression.task import RegressionData, RegressionOptions, RegressionTask

__all__ = ["RegressionData", "RegressionOptions", "RegressionTask"]
