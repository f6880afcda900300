"""Masked-LM continued pretraining and fill-mask: the task and its corpus libraries."""

from bertkit_tasks.mlm.task import CorpusData, MaskedLMOptions, MaskedLMTask

__all__ = ["CorpusData", "MaskedLMOptions", "MaskedLMTask"]
