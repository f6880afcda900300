"""LoRA (`training.lora`, bertkit/model/lora.py): what trains, what is saved, the adapter
file, `bertkit.load` and the merged SavedModel; each other built-in task's step and merged
export (resuming: tests/test_resume.py; tuning: tests/test_tune.py)."""

import dataclasses
import json

import h5py
import keras
import numpy as np
import pytest

import bertkit
from bertkit.errors import UserError
from bertkit.model.backbone import load_pretrained
from bertkit.model.lora import enable_lora, load_adapter, lora_layers
from bertkit.recipes.recipe import load_recipe
from bertkit.serving.inference import predict_examples
from bertkit.testing import serve_in_fresh_process, write_sentiment_tsv, write_tiny_checkpoint
from bertkit.training import run_steps
from bertkit.training.weights import save_weights_atomically

LORA = {"rank": 2, "alpha": 4, "targets": ["query", "value"]}
TEXTS = ["a warm , funny film", "the plot was dull and cold", "good", "really awful ending"]


def recipe_of(tmp, task, data, **training):
    return load_recipe(
        {
            "schema": 1,
            "task": task,
            "output_dir": str(tmp / "run"),
            "backbone": {"preset": str(tmp / "ckpt"), "sequence_length": 16},
            "data": data,
            "training": {
                "epochs": 2,
                "batch_size": 8,
                "learning_rate": 1e-2,
                "lora": LORA,
                "jit_compile": False,
                **training,
            },
        }
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    write_tiny_checkpoint(tmp / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_sentiment_tsv(tmp / "train.tsv", 32, seed=0)
    write_sentiment_tsv(tmp / "dev.tsv", 16, seed=1)
    recipe = recipe_of(
        tmp,
        "classification",
        {"train": str(tmp / "train.tsv"), "validation": str(tmp / "dev.tsv"), "text": "sentence"},
    )
    bertkit.finetune(recipe, verbose=0)
    return tmp, recipe


def lora_model(tmp, recipe, weights=None):
    """The run's task model on the pretrained backbone with LoRA on (`weights` loaded)."""
    run_dir = tmp / "run"
    pretrained = load_pretrained(str(tmp / "ckpt"), sequence_length=16)
    task = bertkit.load(run_dir).task
    model = task.build_model(pretrained.backbone)
    enable_lora(model, pretrained.backbone, recipe.training.lora, {})
    if weights:
        model.load_weights(weights)
    return model


def batch(size=4, length=16, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(5, 100, (size, length)).astype("int32"),
        "segment_ids": np.zeros((size, length), "int32"),
        "padding_mask": np.ones((size, length), "int32"),
    }


def test_recipe_errors_are_one_line_naming_the_key(tmp_path):
    base = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "x"},
        "data": {"train": "t.tsv"},
    }
    for lora, message in [
        ({"rank": 0}, "training.lora.rank: must be at least 1, got 0"),
        (
            {"targets": ["query", "quary"]},
            "training.lora.targets.1: expected one of 'query', 'key'",
        ),
        ({"alpha": 0}, "training.lora.alpha: must be greater than 0.0"),
        ({"rnk": 2}, "training.lora.rnk: unknown key 'rnk'; did you mean"),
    ]:
        with pytest.raises(UserError) as error:
            load_recipe(base, training={"lora": lora})
        assert message in str(error.value) and "\n" not in str(error.value)
    assert load_recipe(base).training.lora is None


def test_only_the_adapters_and_the_head_train(run):
    tmp, recipe = run
    epochs = json.loads((tmp / "run" / "metrics.json").read_text())["epochs"]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    trained = lora_model(tmp, recipe, tmp / "run" / "model" / "model.weights.h5")
    pretrained = lora_model(tmp, recipe)  # as loaded, before training
    changed = {
        a.path
        for a, b in zip(trained.weights, pretrained.weights, strict=True)
        if not np.array_equal(a.numpy(), b.numpy())
    }
    assert changed == {
        "classifier/kernel",
        "classifier/bias",
        "transformer_layer_0/self_attention_layer/query/lora_kernel_a",
        "transformer_layer_0/self_attention_layer/query/lora_kernel_b",
        "transformer_layer_0/self_attention_layer/value/lora_kernel_a",
        "transformer_layer_0/self_attention_layer/value/lora_kernel_b",
    }
    record = json.loads((tmp / "run" / "model" / "task.json").read_text())["lora"]
    assert record["trainable_weights"] == sum(v.numpy().size for v in trained.trainable_weights)
    assert (
        "- LoRA rank 2, alpha 4 on query, value; trainable: "
        in (tmp / "run" / "report.md").read_text()
    )


def test_checkpoints_keep_the_adapters(run, tmp_path):
    # Keras saves a LoRA kernel merged and zeroes the factors on loading: a resumed run
    # would train its adapters no further. bertkit's LoRA layers save them as they are.
    tmp, recipe = run
    trained = lora_model(tmp, recipe, tmp / "run" / "model" / "model.weights.h5")
    save_weights_atomically(trained, tmp_path / "checkpoint.weights.h5")
    restored = lora_model(tmp, recipe, tmp_path / "checkpoint.weights.h5")
    for a, b in zip(trained.weights, restored.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert all(np.abs(layer.lora_kernel_b.numpy()).max() > 0 for layer in lora_layers(restored))


def test_load_serves_the_merged_model_and_the_adapter_file_holds_the_head(run):
    tmp, recipe = run
    trained = lora_model(tmp, recipe, tmp / "run" / "model" / "model.weights.h5")
    loaded = bertkit.load(tmp / "run")
    assert not any(getattr(layer, "lora_enabled", False) for layer in loaded.model.layers)
    expected = trained(batch(), training=False).numpy()
    np.testing.assert_allclose(loaded.model(batch(), training=False).numpy(), expected, atol=1e-5)
    adapter = tmp / "run" / "model" / "lora.weights.h5"
    with h5py.File(adapter) as file:
        assert "classifier" in file and json.loads(file.attrs["lora"])["rank"] == 2
    assert adapter.stat().st_size < (tmp / "run" / "model" / "model.weights.h5").stat().st_size / 4
    fresh = lora_model(tmp, recipe)  # the pretrained backbone + the adapter file
    load_adapter(fresh, adapter)
    np.testing.assert_allclose(fresh(batch(), training=False).numpy(), expected, atol=1e-6)


def test_the_merged_saved_model_matches_in_a_fresh_process(run):
    tmp, recipe = run
    trained = lora_model(tmp, recipe, tmp / "run" / "model" / "model.weights.h5")
    loaded = bertkit.load(tmp / "run")
    examples = [loaded.task.parse_input(text) for text in TEXTS]
    unmerged = predict_examples(loaded.task, trained, examples, 8, loaded.buckets)
    assert [p["label"] for p in loaded.predict(TEXTS)] == [p["label"] for p in unmerged]
    served = serve_in_fresh_process(tmp / "run" / "saved_model", {"text": TEXTS})
    assert served["label"] == [p["label"] for p in unmerged]
    labels = loaded.task.labels
    np.testing.assert_allclose(
        served["probabilities"],
        [[p["probabilities"][label] for label in labels] for p in unmerged],
        atol=1e-5,
    )


def write_task_data(tmp, task):
    if task == "tagging":
        text = "-DOCSTART- -X- O\n\n" + "john NN B-PER\nvisited NN O\nparis NN B-LOC\n\n" * 16
        return {"train": str(write(tmp / "train.txt", text))}
    if task == "span_qa":
        line = {
            "question": "what is it ?",
            "context": "the film was good",
            "answers": {"text": ["good"], "answer_start": [13]},
        }
        lines = [json.dumps({"id": f"q{i}", **line}) for i in range(16)]
        return {"train": str(write(tmp / "train.jsonl", "\n".join(lines) + "\n"))}
    documents = "john visited paris .\nthe film was very good .\n\n" * 16
    return {"train": str(write(tmp / "corpus.txt", documents))}


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("task", ["tagging", "span_qa", "mlm"])
def test_every_task_builds_with_lora_and_trains_a_step(tmp_path, task):
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    options = {"name": task, "max_query_length": 8} if task == "span_qa" else task
    recipe = recipe_of(
        tmp_path,
        options,
        write_task_data(tmp_path, task),
        lora={"rank": 2, "alpha": 4, "targets": ["key", "intermediate"]},
    )
    built = run_steps.build(recipe, run_steps.prepare(recipe))
    before = {v.path: v.numpy().copy() for v in built.model.weights}
    built.trained.fit(
        built.batches.as_dataset(), epochs=1, steps_per_epoch=1, verbose=0, shuffle=False
    )
    changed = {v.path for v in built.model.weights if not np.array_equal(v.numpy(), before[v.path])}
    factors = {p for p in before if "lora_kernel" in p}
    assert {p.split("/")[-2] for p in factors} == {"key", "feedforward_intermediate_dense"}
    assert {p for p in factors if p.endswith("_b")} <= changed  # b starts at zero
    assert all(
        "lora_kernel" in p
        or not p.startswith(
            ("transformer_layer", "token_embedding", "position_embedding", "pooled_dense")
        )
        for p in changed
    )
    assert changed - factors, "the head trains"


@pytest.mark.parametrize("task", ["tagging", "span_qa", "mlm"])
def test_every_task_exports_the_merged_model(tmp_path, task):
    # tagging and span QA: the raw-text SavedModel, in a fresh process, answers as
    # `predict`; MLM: its adapted backbone preset is the merged backbone
    write_tiny_checkpoint(tmp_path / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    options = {"name": task, "max_query_length": 8} if task == "span_qa" else task
    recipe = recipe_of(tmp_path, options, write_task_data(tmp_path, task), epochs=1)
    if task == "mlm":  # its product is the backbone preset, not the SavedModel
        recipe = dataclasses.replace(
            recipe, export=dataclasses.replace(recipe.export, saved_model=False)
        )
    bertkit.finetune(recipe, verbose=0)
    trained = lora_model(tmp_path, recipe, tmp_path / "run" / "model" / "model.weights.h5")
    assert all(np.abs(layer.lora_kernel_b.numpy()).max() > 0 for layer in lora_layers(trained))
    if task == "mlm":
        adapted = load_pretrained(str(tmp_path / "run" / "backbone"), sequence_length=16)
        inputs = {name: trained.get_layer(name).output for name in batch()}
        unmerged = keras.Model(inputs, trained.get_layer("transformer_layer_0").output)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(adapted.backbone(batch())["sequence_output"]),
            keras.ops.convert_to_numpy(unmerged(batch())),
            atol=1e-5,
        )
        return
    loaded = bertkit.load(tmp_path / "run")
    for merged, unmerged in zip(
        keras.tree.flatten(loaded.model(batch(), training=False)),
        keras.tree.flatten(trained(batch(), training=False)),
        strict=True,
    ):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(merged), keras.ops.convert_to_numpy(unmerged), atol=1e-5
        )
    saved_model = tmp_path / "run" / "saved_model"
    if task == "tagging":
        texts = ["john visited paris", "paris", ""]
        served = serve_in_fresh_process(saved_model, {"text": texts})
        entities = [
            [served["entity_text"][i][j] for j in range(served["entity_count"][i])]
            for i in range(len(texts))
        ]
        # `predict` refuses the empty text; the SavedModel finds nothing in it
        assert entities[2] == []
        expected = [[e["text"] for e in p["entities"]] for p in loaded.predict(texts[:2])]
        assert entities[:2] == expected
    else:
        pairs = [("what is it ?", "the film was good"), ("what ?", "a dull film")]
        served = serve_in_fresh_process(
            saved_model, {"question": [q for q, _ in pairs], "context": [c for _, c in pairs]}
        )
        expected = loaded.predict(pairs)
        assert served["answer"] == [p["answer"] for p in expected]
        np.testing.assert_allclose(served["score"], [p["score"] for p in expected], atol=1e-4)
