"""The embedding task: a bi-encoder trained with in-batch negatives (or on scored pairs),
end to end through the contract test, and its loss, metrics and data errors by hand."""

import json
import os
import random
import sys

import numpy as np
import pytest

import bertkit
from bertkit.testing import run_task_contract_test
from bertkit.testing.tiny import FILLER, NEGATIVE, POSITIVE

TEXTS = ["the good film", "a dull meal", "funny story of paris"]
ENTRY_POINT = "embedding = bertkit_tasks.embedding:EmbeddingTask"


@pytest.fixture(scope="module", autouse=True)
def registered(tmp_path_factory):
    """The task's entry point (pyproject.toml) where the installed bertkit predates it: a
    distribution's metadata on the path of this process and of those it starts."""
    from bertkit.registry import task_names

    if "embedding" in task_names():
        yield
        return
    site = tmp_path_factory.mktemp("site")
    info = site / "bertkit_embedding_entry-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bertkit-embedding-entry\n")
    (info / "entry_points.txt").write_text(f"[bertkit.tasks]\n{ENTRY_POINT}\n")
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), previous]))
    sys.path.insert(0, str(site))
    yield
    sys.path.remove(str(site))
    if previous is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = previous


def write_pairs(path, count, seed=0, negatives=False):
    """Anchors and positives sharing one key word among words that say nothing (a random
    model's mean pooling hears those most), which a tiny model learns to match."""
    rng = random.Random(seed)
    keys, noise = POSITIVE + NEGATIVE + FILLER[:20], FILLER[20:]
    lines = ["anchor\tpositive" + ("\tnegative" if negatives else "")]
    for index in range(count):
        key = keys[index % len(keys)]
        line = f"the {key}\t{key} " + " ".join(rng.sample(noise, 5))
        if negatives:
            line += f"\t{rng.choice(keys)} " + " ".join(rng.sample(noise, 5))
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return path


def compare_vectors(predictions, served):
    np.testing.assert_allclose(
        served["embedding"], [p["embedding"] for p in predictions], atol=1e-5
    )


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("embedding")
    write_pairs(tmp_path / "train.tsv", 64, seed=0, negatives=True)
    write_pairs(tmp_path / "dev.tsv", 24, seed=1)
    return tmp_path, run_task_contract_test(
        "embedding",
        tmp_path / "train.tsv",
        data={"validation": str(tmp_path / "dev.tsv")},
        training={"epochs": 4, "batch_size": 16, "batch_order": "random"},
        task_options={"pooling": "mean", "normalize": True},
        directory=tmp_path,
        inputs=TEXTS,
        bad_input=42,
        compare=compare_vectors,
    )


def test_passes_the_contract_test_and_learns_to_retrieve(contract):
    tmp_path, result = contract
    metrics = json.loads((result["run_dir"] / "metrics.json").read_text())
    assert metrics["monitor"] == "val_mrr_at_10"
    final = metrics["final"]["validation"]
    assert set(final) == {"mrr_at_10", "recall_at_1", "recall_at_10"}
    first = metrics["epochs"][0]["val_mrr_at_10"]
    assert final["mrr_at_10"] > first


def test_the_saved_models_vectors_equal_predicts(contract):
    tmp_path, result = contract  # the contract test served `TEXTS` in a fresh process
    vectors = np.array(result["served"]["embedding"])
    np.testing.assert_allclose(vectors, [p["embedding"] for p in result["predictions"]], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # normalize
    assert set(result["predictions"][0]) == {"embedding"} and vectors.shape == (3, 32)
    loaded = bertkit.load(result["run_dir"])
    np.testing.assert_allclose(
        loaded.predict([{"text": TEXTS[1]}])[0]["embedding"], vectors[1], atol=1e-5
    )


# ---------------------------------------------------------------- the losses, by hand
def numpy_mnrl(vectors, keys, rows, scale):
    """sentence-transformers' MNRL over a batch (texts: anchor, positive[, negative]),
    with another row's equal positive and a repeated row's negative left out."""
    unit = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
    batch = len(unit)
    losses = []
    for i in range(batch):
        candidates = [j for j in range(batch) if j == i or keys[j] != keys[i]]
        scores = [scale * unit[i, 0] @ unit[j, 1] for j in candidates]
        firsts = [j for j in range(batch) if rows[j] not in rows[:j]]
        scores += [scale * unit[i, 0] @ unit[j, t] for t in range(2, unit.shape[1]) for j in firsts]
        scores = np.array(scores)
        own = scale * unit[i, 0] @ unit[i, 1]
        losses.append(np.log(np.exp(scores - scores.max()).sum()) + scores.max() - own)
    return np.array(losses)


@pytest.mark.parametrize("texts", [2, 3])
def test_mnrl_equals_numpy_on_a_hand_made_batch(texts):
    from bertkit_tasks.embedding.losses import MultipleNegativesRankingLoss

    vectors = np.random.default_rng(0).normal(size=(5, texts, 4)).astype("float32")
    vectors[4] = vectors[0]  # a filler row: row 0 again
    keys, rows = np.array([0, 1, 2, 1, 0]), np.array([7, 3, 5, 9, 7])  # rows 1, 3: one positive
    vectors[3, 1] = vectors[1, 1]
    y_true = np.stack([keys, rows], axis=1).astype("float32")
    loss = MultipleNegativesRankingLoss(scale=20.0, reduction=None)
    got = np.asarray(loss(y_true, vectors))
    np.testing.assert_allclose(got, numpy_mnrl(vectors, keys, rows, 20.0), rtol=1e-5, atol=1e-5)
    weights = np.array([1, 1, 1, 1, 0], "float32")  # as training weighs the filler row
    mean = MultipleNegativesRankingLoss(scale=20.0)(y_true, vectors, sample_weight=weights)
    np.testing.assert_allclose(float(mean), got[:4].sum() / 5, rtol=1e-5)  # sum over batch


def test_cosine_loss_equals_numpy():
    from bertkit_tasks.embedding.losses import CosineSimilarityLoss

    vectors = np.random.default_rng(1).normal(size=(4, 2, 3)).astype("float32")
    scores = np.array([0.0, 0.25, 0.5, 1.0], "float32")
    a, b = vectors[:, 0], vectors[:, 1]
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    got = CosineSimilarityLoss(reduction=None)(scores, vectors)
    np.testing.assert_allclose(np.asarray(got), (cosine - scores) ** 2, rtol=1e-5)


# ---------------------------------------------------------------- metrics, by hand
def test_retrieval_metrics_on_hand_made_rankings():
    from bertkit_tasks.embedding.retrieval_metrics import (
        gold_ranks,
        mrr_at_k,
        recall_at_k,
        spearman,
    )

    scores = np.array(
        [
            [0.9, 0.1, 0.2],  # gold 0 first
            [0.8, 0.3, 0.5],  # gold 1 third
            [0.4, 0.4, 0.1],  # gold 0 tied with 1: second
        ]
    )
    ranks = gold_ranks(scores, np.array([0, 1, 0]))
    assert ranks.tolist() == [1, 3, 2]
    assert mrr_at_k(ranks, 10) == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert mrr_at_k(ranks, 2) == pytest.approx((1 + 1 / 2) / 3)
    assert recall_at_k(ranks, 1) == pytest.approx(1 / 3) and recall_at_k(ranks, 10) == 1.0
    assert gold_ranks(np.zeros((2, 4)), np.array([0, 3])).tolist() == [4, 4]  # collapsed
    # ranks [1, 2.5, 2.5, 4] and [3, 1, 2, 4]: 1.5 / sqrt(4.5 * 5) (scipy.stats.spearmanr's)
    assert spearman(np.array([1, 2, 2, 5]), np.array([3, 1, 2, 4])) == pytest.approx(0.3162278)
