"""Multi-label classification: the task, its label lists, metrics and tuned thresholds."""

from bertkit_tasks.multi_label.task import MultiLabelData, MultiLabelOptions, MultiLabelTask

__all__ = ["MultiLabelData", "MultiLabelOptions", "MultiLabelTask"]
