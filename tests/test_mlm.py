"""The mlm task: corpus -> adapted backbone preset, fill-mask predictions, raw-text SavedModel."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bertkit
from bertkit.errors import UserError
from bertkit.model.backbone import load_architecture, load_pretrained
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.padding import pad_batch
from bertkit.serving.inference import predict_examples
from bertkit.task import Features
from bertkit.testing import (
    run_task_contract_test,
    tiny_vocabulary,
    write_sentiment_tsv,
    write_tiny_checkpoint,
)
from bertkit_tasks.mlm import CorpusData, MaskedLMOptions, MaskedLMTask

SENTENCES = [
    "john visited paris .",
    "smith works for acme corp .",
    "the film was very good .",
    "it was quite funny .",
]
QUERIES = ["John visited [MASK].", ["smith works for [MASK] corp .", "the [MASK] was very good"]]


def write_corpus(path, count):
    """`count` documents of the same four sentences: a corpus a tiny model learns fast."""
    path.write_text("\n\n".join(["\n".join(SENTENCES)] * count) + "\n")
    return path


def add_head_tensors(checkpoint):
    """Adds BertForPreTraining head tensors (old gamma/beta LayerNorm names) to the checkpoint."""
    state = load_file(str(checkpoint / "model.safetensors"))
    vocabulary, hidden = state["embeddings.word_embeddings.weight"].shape
    rng = np.random.default_rng(1)
    heads = {
        "cls.predictions.transform.dense.weight": (hidden, hidden),
        "cls.predictions.transform.dense.bias": (hidden,),
        "cls.predictions.transform.LayerNorm.gamma": (hidden,),
        "cls.predictions.transform.LayerNorm.beta": (hidden,),
        "cls.predictions.bias": (vocabulary,),
        "cls.seq_relationship.weight": (2, hidden),
        "cls.seq_relationship.bias": (2,),
    }
    heads = {
        name: (rng.normal(size=shape) * 0.02).astype(np.float32) for name, shape in heads.items()
    }
    heads["cls.predictions.transform.LayerNorm.gamma"] += 1
    save_file({**state, **heads}, str(checkpoint / "model.safetensors"))
    return heads


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    checkpoint = write_tiny_checkpoint(root / "checkpoint", hidden_size=64, intermediate_size=128)
    heads = add_head_tensors(checkpoint)
    recipe = {
        "schema": 1,
        "task": "mlm",
        "backbone": {"preset": str(checkpoint), "sequence_length": 32},
        "data": {"train": str(write_corpus(root / "corpus.txt", 200))},  # 10 for validation
        "training": {"epochs": 8, "batch_size": 8, "learning_rate": 3e-3},
        "export": {"saved_model": False},  # the contract test's run serves the SavedModel
    }
    model = bertkit.finetune(recipe, output_dir=root / "run", verbose=0)
    write_corpus(root / "valid.txt", 12)
    return root, checkpoint, heads, model


def test_heads_start_from_the_checkpoint_and_learn(trained):
    root, checkpoint, heads, finetuned = trained
    task, pretrained = finetuned.task, load_pretrained(str(checkpoint), sequence_length=32)
    model = task.build_model(pretrained.backbone)
    task.initialize_head(model, pretrained.checkpoint_tensors())
    weights = {w.path: w.numpy() for w in model.weights}
    np.testing.assert_array_equal(
        weights["mlm_head/intermediate_dense/kernel"],
        heads["cls.predictions.transform.dense.weight"].T,
    )
    np.testing.assert_array_equal(
        weights["mlm_head/intermediate_layer_norm/gamma"],
        heads["cls.predictions.transform.LayerNorm.gamma"],
    )
    np.testing.assert_array_equal(
        weights["nsp_head/kernel"], heads["cls.seq_relationship.weight"].T
    )
    documents = task.read(str(root / "valid.txt"))
    before = task.evaluate(documents, predict_examples(task, model, documents, 16, (32,)))
    after = finetuned.evaluate(root / "valid.txt")
    assert after == finetuned.evaluate(root / "valid.txt")  # evaluation masks are fixed
    assert after["perplexity"] < before["perplexity"] / 4
    assert after["masked_accuracy"] > max(0.35, before["masked_accuracy"] + 0.25)


def test_held_out_documents_are_evaluated_every_epoch(trained):
    root = trained[0]
    results = json.loads((root / "run" / "metrics.json").read_text())
    perplexities = [epoch["val_perplexity"] for epoch in results["epochs"]]
    assert results["monitor"] == "val_perplexity" and len(perplexities) == 8
    assert perplexities[-1] < perplexities[0] / 3
    validation = results["final"]["validation"]  # the best epoch's weights, evaluated again
    assert set(validation) == {"perplexity", "mlm_loss", "masked_accuracy", "nsp_accuracy"}
    assert validation["perplexity"] == pytest.approx(min(perplexities), rel=1e-4)
    assert "| validation | perplexity |" in (root / "run" / "report.md").read_text()


def test_fill_mask_predictions(trained):
    root, _, _, _ = trained
    predictions = bertkit.load(root / "run").predict(QUERIES)
    assert [len(p["masks"]) for p in predictions] == [1, 2]
    assert all(len(top) == 5 for p in predictions for top in p["masks"])
    assert "paris" in [t["token"] for t in predictions[0]["masks"][0][:3]]


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    def same_fill_mask(predictions, served):
        assert served["num_masks"] == [len(p["masks"]) for p in predictions]
        for row, prediction in enumerate(predictions):
            for slot, top in enumerate(prediction["masks"]):
                assert served["tokens"][row][slot] == [t["token"] for t in top]
                np.testing.assert_allclose(
                    served["scores"][row][slot], [t["score"] for t in top], atol=1e-4
                )

    tmp_path = tmp_path_factory.mktemp("mlm_contract")
    queries = ["John visited [MASK].", "the [MASK] was very [MASK] ."]
    return run_task_contract_test(
        "mlm",
        write_corpus(tmp_path / "corpus.txt", 24),
        directory=tmp_path,
        data={"validation": str(write_corpus(tmp_path / "valid.txt", 4))},
        inputs=queries,
        serving_inputs={"text": queries},
        compare=same_fill_mask,
        bad_input="no mask in this text",
    )


def test_passes_the_contract_test(contract):
    # the SavedModel's fill-mask answers are predict's (`same_fill_mask`); a text with
    # fewer masks than another of its batch gets empty padding slots
    assert contract["served"]["num_masks"] == [1, 2]
    assert contract["served"]["tokens"][0][1] == [""] * 5


def test_adapted_backbone_preset_serves_another_task(trained, tmp_path):
    root, _, _, _ = trained
    preset = root / "run" / "backbone"
    saved = load_pretrained(str(preset), sequence_length=32)
    reference = load_architecture(root / "run" / "model")
    bertkit.load(root / "run").task.build_model(reference.backbone).load_weights(
        root / "run" / "model" / "model.weights.h5"
    )
    inputs = {
        "token_ids": np.array([[2, 60, 70, 80, 3]]),
        "segment_ids": np.zeros((1, 5), int),
        "padding_mask": np.ones((1, 5), int),
    }
    np.testing.assert_allclose(
        saved.backbone(inputs)["sequence_output"],
        reference.backbone(inputs)["sequence_output"],
        atol=1e-5,
    )
    assert saved.hidden_act == "gelu"
    data = write_sentiment_tsv(tmp_path / "train.tsv", 48)
    classifier = bertkit.finetune(
        {
            "schema": 1,
            "task": "classification",
            "backbone": {"preset": str(preset), "sequence_length": 32},
            "data": {"train": str(data), "text": "sentence"},
            "training": {"epochs": 1, "batch_size": 16},
            "export": {"saved_model": False},
        },
        output_dir=tmp_path / "run",
        verbose=0,
    )
    assert classifier.predict(["a good film"])[0]["label"] in {"positive", "negative"}


def test_validation_split_and_inputs():
    documents = list(range(100))
    task = MaskedLMTask(MaskedLMOptions(), CorpusData("c.txt"), None, 32)
    kept, held = task.split_validation(documents)
    assert len(held) == 5 and sorted(kept + held) == documents
    assert task.split_validation(documents) == (kept, held)  # seeded
    assert task.split_validation(documents[:20]) == (documents[:20], None)  # 1 document: too few
    with pytest.raises(UserError, match=r"\[MASK\]"):
        task.parse_input("no mask here")


def test_outputs_reduce_to_instance_records_and_fill_mask_tokens():
    vocabulary = tiny_vocabulary()
    task = MaskedLMTask(
        MaskedLMOptions(top_k=2), CorpusData("c.txt"), WordPieceTokenizer(vocabulary, True), 32
    )
    logits = np.zeros((2, 2, len(vocabulary)), np.float32)  # (rows, slots, vocabulary)
    logits[0, 0, 7] = 50  # row 0: its one masked token surely right; row 1: uniform, wrong
    batch = {"mask_ids": np.array([[7, -1], [5, 6]]), "next_sentence": np.array([0, 0])}
    reduced = task.reduce_outputs(batch, {"mlm": logits, "nsp": np.array([[2.0, 0], [0, 2.0]])})
    records = task.decode([], Features({"token_ids": [[2, 3]] * 2}, np.full(2, -1)), reduced)
    assert records[0] == {
        "masked_tokens": 1,
        "correct": 1,
        "loss": pytest.approx(0, abs=1e-6),
        "next_sentence_correct": True,
    }
    assert records[1]["masked_tokens"] == 2 and not records[1]["next_sentence_correct"]
    metrics = task.evaluate([], records)
    assert metrics["masked_accuracy"] == 1 / 3 and metrics["nsp_accuracy"] == 0.5
    assert metrics["perplexity"] == pytest.approx(len(vocabulary) ** (2 / 3), rel=1e-5)

    features = task.featurize([task.parse_input("john visited [MASK] .")], training=False)
    batch = pad_batch(features, np.arange(1), (32,))
    logits = np.zeros((1, features.columns["mask_positions"].shape[1], len(vocabulary)))
    logits[0, 0, [vocabulary.index("paris"), vocabulary.index("london")]] = 5, 4
    reduced = task.reduce_outputs(batch, {"mlm": logits})
    [prediction] = task.decode([], features, {k: list(v) for k, v in reduced.items()})
    assert [top["token"] for top in prediction["masks"][0]] == ["paris", "london"]


def test_instances_and_dynamic_masks_without_next_sentence_prediction(tmp_path):
    options = MaskedLMOptions(next_sentence_prediction=False, whole_word_masking=True)
    task = MaskedLMTask(
        options, CorpusData("c.txt"), WordPieceTokenizer(tiny_vocabulary(), True), 32
    )
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": "\n".join(SENTENCES)}) + "\n" for _ in range(3)))
    features = task.featurize(task.read(str(path)), training=True)
    assert all(
        ids[0] == 2 and ids[-1] == 3 and (ids == 3).sum() == 1 and not segments.any()
        for ids, segments in zip(
            features.columns["token_ids"], features.columns["segment_ids"], strict=True
        )
    )
    batch = pad_batch(features, np.arange(len(features)), (32,))
    first, targets, weights = task.make_batch(batch, training=True, rng=np.random.default_rng(0))
    second, _, _ = task.make_batch(batch, training=True, rng=np.random.default_rng(1))
    assert list(targets) == list(weights) == ["mlm"]
    assert not np.array_equal(first["token_ids"], second["token_ids"])
    used = weights["mlm"] > 0  # unused prediction slots: weight 0, target 0
    assert 0 < used.sum() < used.size and not targets["mlm"][~used].any()
    rows = np.nonzero(used)[0]
    assert np.array_equal(
        batch["token_ids"][rows, first["mask_positions"][used]], targets["mlm"][used]
    )


def test_micro_batches_count_every_masked_token_and_pair_once(tmp_path):
    from bertkit.batching.plan import BatchPlan
    from bertkit.padding import bucket_lengths

    task = MaskedLMTask(
        MaskedLMOptions(), CorpusData("c.txt"), WordPieceTokenizer(tiny_vocabulary(), True), 64
    )
    path = tmp_path / "c.txt"
    write_corpus(path, 40)
    features = task.featurize(task.read(str(path)), training=True)
    batches = BatchPlan(
        16, bucket_lengths(64), seed=0, order="random", micro_batches=4
    ).training_batches(task, features)
    steps = list(batches)
    assert len(steps) == 4 * -(-len(features) // 16) and len(features) > 32
    for k in range(0, len(steps), 4):
        parts = steps[k : k + 4]
        # Keras averages each output's weighted loss over its positions, then over
        # the parts; with any per-position value in place of the loss, that must be
        # its mean over the batch's masked tokens (and over its sentence pairs).
        for name in ("mlm", "nsp"):
            value = [np.asarray(targets[name], np.float64) + 1.0 for _, targets, _ in parts]
            used = [weights[name] > 0 for _, _, weights in parts]
            mean = np.mean(
                [
                    np.mean(weights[name] * v)
                    for (_, _, weights), v in zip(parts, value, strict=True)
                ]
            )
            expected = np.concatenate([v[u] for v, u in zip(value, used, strict=True)]).mean()
            assert mean == pytest.approx(expected, rel=1e-5), name
        slots = np.concatenate([w["mlm"].ravel() for _, _, w in parts])
        assert (slots == 0).any()  # unused prediction slots weigh nothing


def test_saved_model_refuses_bad_shapes_and_answers_an_empty_batch(contract):
    from bertkit.testing import assert_serving_refuses_bad_shapes

    assert_serving_refuses_bad_shapes(contract["run_dir"] / "saved_model", ["text"])
