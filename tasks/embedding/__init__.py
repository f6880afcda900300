"""Sentence embeddings: a bi-encoder trained with in-batch negatives or on scored pairs."""

from bertkit_tasks.embedding.task import EmbeddingData, EmbeddingOptions, EmbeddingTask

__all__ = ["EmbeddingData", "EmbeddingOptions", "EmbeddingTask"]
