"""Token tagging (NER, POS, chunking): the task and its CoNLL libraries."""

from bertkit_tasks.tagging.task import TaggingData, TaggingOptions, TaggingTask

__all__ = ["TaggingData", "TaggingOptions", "TaggingTask"]
