"""Validation metrics of sentence embeddings, in NumPy: retrieval (MRR@k, recall@k) of each
anchor's positive among the split's positives (correlations with gold scores, for STS, are
`bertkit.metrics.correlation`'s)."""

from __future__ import annotations

import numpy as np


def cosine_scores(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
    """(queries, corpus) cosine similarities of two sets of vectors.

    Example:
        >>> cosine_scores(np.array([[1.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 3.0]])).tolist()
        [[1.0, 0.0]]
    """
    return _unit(queries) @ _unit(corpus).T


def paired_cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The cosine similarity of each row of `first` with the same row of `second`.

    Example:
        >>> paired_cosines(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[3.0, 0.0], [-1.0, -1.0]]))
        array([ 1., -1.])
    """
    return np.sum(_unit(first) * _unit(second), axis=1)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def gold_ranks(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """The 1-based rank of each query's gold document among all documents, by score.

    Ties count against the gold document (it ranks after every document scored as high),
    so that vectors that collapsed to one point rank nothing first.

    Example:
        >>> scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.2, 0.8]])
        >>> gold_ranks(scores, np.array([0, 1])).tolist()  # query 2: a tie, then 0.8 above
        [1, 3]
    """
    gold_scores = scores[np.arange(len(scores)), gold][:, None]
    return (scores >= gold_scores).sum(axis=1)


def mrr_at_k(ranks: np.ndarray, k: int = 10) -> float:
    """Mean reciprocal rank, a rank over `k` counting 0.

    Example:
        >>> mrr_at_k(np.array([1, 2, 11]), k=10)  # (1 + 1/2 + 0) / 3
        0.5
    """
    ranks = np.asarray(ranks, dtype=float)
    return float(np.where(ranks <= k, 1.0 / ranks, 0.0).mean())


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    """The fraction of queries whose gold document ranks within the first `k`.

    Example:
        >>> recall_at_k(np.array([1, 2, 11]), k=1), recall_at_k(np.array([1, 2, 11]), k=10)
        (0.3333333333333333, 0.6666666666666666)
    """
    return float((np.asarray(ranks) <= k).mean())


def retrieval_metrics(queries: np.ndarray, corpus: np.ndarray, gold: np.ndarray) -> dict:
    """MRR@10, recall@1 and recall@10 of retrieving `corpus[gold[i]]` for `queries[i]` by
    cosine similarity (sentence-transformers' `InformationRetrievalEvaluator` measures).

    Example:
        >>> queries = np.array([[1.0, 0.1], [0.1, 1.0]])
        >>> corpus = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> retrieval_metrics(queries, corpus, np.array([1, 1]))
        {'mrr_at_10': 0.75, 'recall_at_1': 0.5, 'recall_at_10': 1.0}
    """
    ranks = gold_ranks(cosine_scores(queries, corpus), np.asarray(gold))
    return {
        "mrr_at_10": mrr_at_k(ranks, 10),
        "recall_at_1": recall_at_k(ranks, 1),
        "recall_at_10": recall_at_k(ranks, 10),
    }
