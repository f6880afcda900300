"""Multiple choice: the task, its rows of packed choices, its model and its data reader."""

from bertkit_tasks.multiple_choice.task import (
    MultipleChoiceData,
    MultipleChoiceOptions,
    MultipleChoiceTask,
)

__all__ = ["MultipleChoiceData", "MultipleChoiceOptions", "MultipleChoiceTask"]
