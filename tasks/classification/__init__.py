"""Text and text-pair classification: the task and its metrics."""

from bertkit_tasks.classification.task import (
    ClassificationData,
    ClassificationOptions,
    ClassificationTask,
)

__all__ = ["ClassificationData", "ClassificationOptions", "ClassificationTask"]
