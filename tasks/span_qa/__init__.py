"""Extractive question answering (SQuAD v1.1 / v2.0): the task and its SQuAD libraries."""

from bertkit_tasks.span_qa.task import SpanQAOptions, SpanQATask

__all__ = ["SpanQAOptions", "SpanQATask"]
