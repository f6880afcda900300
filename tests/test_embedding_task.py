"""The embedding task: a bi-encoder trained with in-batch negatives (or on scored pairs),
end to end through the contract test, and its loss, metrics and data errors by hand."""

import json
import os
import random
import sys

import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.testing import run_task_contract_test, write_tiny_checkpoint
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
    embedded = bertkit.embed(result["run_dir"], TEXTS)  # `bertkit embed RUN`: the same vectors
    np.testing.assert_allclose(embedded, vectors, atol=1e-5)
    loaded = bertkit.load(result["run_dir"])
    np.testing.assert_allclose(
        loaded.predict([{"text": TEXTS[1]}])[0]["embedding"], vectors[1], atol=1e-5
    )


def test_an_int8_model_gives_nearly_the_float_vectors(contract):
    from bertkit.serving import quantize

    _, result = contract
    assert quantize.quality_budget(bertkit.load(result["run_dir"]).task) == 1.0  # MRR points
    int8 = quantize.quantized(bertkit.load(result["run_dir"]))
    vectors = np.array([p["embedding"] for p in int8.predict(TEXTS)])
    floats = np.array([p["embedding"] for p in result["predictions"]])
    assert np.all(np.sum(vectors * floats, axis=1) > 0.99)  # unit vectors: their cosines
    assert set(int8.evaluate()) == {"mrr_at_10", "recall_at_1", "recall_at_10"}


# ---------------------------------------------------------------- the losses, by hand
def numpy_mnrl(vectors, keys, rows, scale):
    """sentence-transformers' MNRL over a batch (texts: anchor, positive[, negative]),
    each distinct positive text and each row's negative a candidate once, the anchor's own
    positive text in another row none."""
    unit = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
    batch = len(unit)
    losses = []
    for i in range(batch):
        candidates = [
            j for j in range(batch) if j == i or keys[j] != keys[i] and keys[j] not in keys[:j]
        ]
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
    without_filler = np.asarray(loss(y_true[:4], vectors[:4]))  # the filler changes nothing
    np.testing.assert_allclose(got[:4], without_filler, rtol=1e-6, atol=1e-6)
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
    from bertkit.metrics.correlation import spearman
    from bertkit_tasks.embedding.retrieval_metrics import gold_ranks, mrr_at_k, recall_at_k

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


# ---------------------------------------------------------------- recipes and data
def recipe(tmp_path, task=None, **training):
    return {
        "schema": 1,
        "task": {"name": "embedding", **(task or {})},
        "backbone": {"preset": str(tmp_path / "ckpt"), "sequence_length": 32},
        "data": {"train": str(tmp_path / "train.tsv")},
        "training": {"epochs": 1, "batch_size": 8, **training},
    }


def test_mnrl_refuses_micro_batches_in_one_line(tmp_path):
    from bertkit.recipes.recipe import load_recipe

    spec = recipe(tmp_path, batch_order="random", micro_batches=2)
    with pytest.raises(UserError) as refused:
        load_recipe(spec)
    assert str(refused.value) == (
        "<recipe>: training.micro_batches: the embedding task's loss reads the whole batch "
        "(in-batch negatives), and each micro-batch would see only its own rows; set "
        "micro_batches to 1 (gradient_accumulation_steps keeps batch_size rows a step)"
    )
    load_recipe(recipe(tmp_path, {"loss": "cosine"}, batch_order="random", micro_batches=2))


def test_several_tensorflow_replicas_are_refused_for_mnrl():
    from bertkit.batching.plan import BatchPlan
    from bertkit.recipes.sections import TrainingConfig

    training = TrainingConfig(batch_size=8)
    BatchPlan.check_devices(training, 2, "jax", spans_batch=True)  # the global batch's loss
    BatchPlan.check_devices(training, 1, "tensorflow", spans_batch=True)
    with pytest.raises(UserError, match="each of TensorFlow's 2 replicas would see only its"):
        BatchPlan.check_devices(training, 2, "tensorflow", spans_batch=True)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "train.tsv",
            "anchor\tpos\nthe film\tgood film\n",
            "train.tsv:2: positive: missing column 'positive' (columns: anchor, pos)",
        ),
        (
            "train.tsv",
            "anchor\tpositive\nthe film\tgood film\n \tbad film\n",
            "train.tsv:3: anchor: empty value in column 'anchor'",
        ),
        (
            "train.jsonl",
            '{"anchor": "a film", "positive": "good"}\n{"anchor": "a film", "positive": 4}\n',
            "train.jsonl:2: positive: expected a text, got 4",
        ),
        (
            "train.jsonl",
            '{"anchor": "a", "positive": "b", "negative": "c"}\n{"anchor": "a", "positive": "b"}\n',
            "train.jsonl:2: negative: missing column 'negative' (columns: anchor, positive)",
        ),
    ],
)
def test_bad_pairs_are_one_line_naming_file_line_and_column(tmp_path, name, content, message):
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / name).write_text(content)
    spec = recipe(tmp_path)
    spec["data"]["train"] = str(tmp_path / name)
    with pytest.raises(UserError) as refused:
        bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    assert str(refused.value).endswith(message) and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_a_score_out_of_its_declared_range_names_its_line(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "train.tsv").write_text("a\tb\tsim\none\ttwo\t4.5\nthree\tfour\t5.5\n")
    spec = recipe(tmp_path, {"loss": "cosine"})
    spec["data"].update(text="a", text_pair="b", score="sim", score_max=5.0)
    with pytest.raises(UserError, match=r"train.tsv:3: sim: expected a score from 0 to 5, got"):
        bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)


def test_pooling_defaults_to_what_a_sentence_transformers_folder_declares(tmp_path):
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import make_task

    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    modules = [
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    examples = [bertkit_example("a", "b")]
    state = make_task(load_recipe(recipe(tmp_path))).fit_state(examples)
    assert state == {"poolings": ["cls"], "normalize": True, "texts": 2}
    chosen = recipe(tmp_path, {"pooling": "mean+max", "normalize": False})
    state = make_task(load_recipe(chosen)).fit_state(examples)
    assert state == {"poolings": ["max", "mean"], "normalize": False, "texts": 2}
    (folder / "modules.json").unlink()  # a plain checkpoint: mean, not normalized
    assert make_task(load_recipe(recipe(tmp_path))).fit_state(examples)["poolings"] == ["mean"]


def bertkit_example(anchor, positive):
    from bertkit_tasks.embedding.pairs import PairExample

    return PairExample(anchor, positive)


def test_scored_pairs_train_with_the_cosine_loss_and_report_spearman(tmp_path):
    write_tiny_checkpoint(tmp_path / "ckpt")
    rng = random.Random(0)
    keys, noise = POSITIVE + NEGATIVE, FILLER[20:]
    rows = ["text\ttext_pair\tscore"]
    for index in range(48):
        key, other = keys[index % 16], keys[(index + 5) % 16]
        same = index % 2 == 0
        pair = f"{key if same else other} " + " ".join(rng.sample(noise, 3))
        rows.append(f"the {key}\t{pair}\t{4 if same else 1}")
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    spec = recipe(tmp_path, {"loss": "cosine", "pooling": "mean"}, epochs=3, learning_rate=3e-3)
    spec["data"].update(validation=str(tmp_path / "train.tsv"), score_max=5.0)
    spec["export"] = {"saved_model": False}
    model = bertkit.finetune(spec, output_dir=tmp_path / "run", verbose=0)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["monitor"] == "val_spearman"
    assert set(metrics["final"]["validation"]) == {"spearman", "pearson"}
    assert metrics["epochs"][-1]["val_spearman"] > max(0.5, metrics["epochs"][0]["val_spearman"])
    assert len(model.predict(["the good"])[0]["embedding"]) == 32


def test_kill_9_mid_epoch_then_resume_with_lora_gives_the_uninterrupted_run(tmp_path, capfd):
    """Killed before step 8 of epoch 2 (10 steps an epoch, a checkpoint every 5), the run
    resumes after its step 5 and ends as the uninterrupted run (LoRA's factors included)."""
    import signal
    import subprocess
    from pathlib import Path

    import yaml

    write_tiny_checkpoint(tmp_path / "ckpt")
    write_pairs(tmp_path / "train.tsv", 40, seed=0, negatives=True)
    write_pairs(tmp_path / "dev.tsv", 12, seed=1)
    spec = recipe(tmp_path, {"pooling": "mean"}, epochs=2, batch_size=4, learning_rate=1e-2)
    spec["data"]["validation"] = str(tmp_path / "dev.tsv")
    spec["training"].update(
        checkpoint_every_steps=5, lora={"rank": 4, "alpha": 8, "targets": ["query", "value"]}
    )
    spec["export"] = {"saved_model": False}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**spec, "output_dir": "interrupted"}))
    signal_at_step = Path(__file__).with_name("signal_at_step.py")
    killed = subprocess.run(
        [sys.executable, str(signal_at_step), "finetune", str(tmp_path / "r.yaml")],
        env={**os.environ, "BERTKIT_TEST_SIGNAL": "SIGKILL,1,7"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    bertkit.finetune(tmp_path / "r.yaml", verbose=0)
    assert "interrupted at epoch 2 step 5" in capfd.readouterr().err  # resumed there
    bertkit.finetune(spec, output_dir=tmp_path / "uninterrupted", verbose=0)

    def steps(name):
        return json.loads((tmp_path / name / "steps.json").read_text())["steps"]

    def final(name):
        return json.loads((tmp_path / name / "metrics.json").read_text())["final"]

    assert [s["loss"] for s in steps("interrupted")] == pytest.approx(
        [s["loss"] for s in steps("uninterrupted")], rel=1e-5
    )
    expected = final("uninterrupted")["validation"]
    assert final("interrupted")["validation"] == pytest.approx(expected)
    assert (tmp_path / "interrupted" / "model" / "lora.weights.h5").is_file()
