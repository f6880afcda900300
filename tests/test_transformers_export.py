"""`bertkit export --format transformers` (bertkit/serving/transformers_export.py): the
exported weights give the Keras model's logits in the NumPy reference of transformers' BERT,
bertkit reads the folder back as a preset, the config and tokenizer files, one-line errors.

The runs are written directly (the task's model on a tiny random checkpoint, saved as
`finetune` saves it): what is checked is the export, not training, and a tiny `finetune`
costs a minute here.
"""

import json

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

from bertkit.cli import main
from bertkit.errors import UserError
from bertkit.model.architecture import save_architecture
from bertkit.model.backbone import load_pretrained
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.run_dir import FINISHED, RUNNING, RunDirectory
from bertkit.serving.finetuned import build_task, task_description
from bertkit.serving.transformers_export import export_transformers
from bertkit.testing import tiny_vocabulary, write_tiny_checkpoint
from tests.numpy_bert import numpy_bert_forward

SEQUENCE_LENGTH = 24
TASKS = {  # name -> (task, options, data, state)
    "classification": ("classification", {}, {}, {"labels": ["negative", "positive"]}),
    "pairs": (
        "classification",
        {},
        {"text_pair": "hypothesis"},
        {"labels": ["entailment", "neutral", "contradiction"]},
    ),
    "tagging": ("tagging", {}, {}, {"labels": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]}),
    "span_qa": ("span_qa", {"version": "2.0"}, {}, {"null_score_threshold": 1.5}),
    "multi_label": (
        "multi_label",
        {},
        {},
        {"labels": ["film", "negative", "positive"], "thresholds": [0.3, 0.3, 0.3]},
    ),
    "regression": (
        "regression",
        {},
        {"text_pair": "sentence2"},
        {"target_mean": 2.5, "target_std": 1.5},
    ),
}
TEXTS = ["john smith visited paris", "the film was good and very funny, really"]


def write_run(folder, name, status=FINISHED):
    """A run directory of the task `TASKS[name]` with random head weights, as `finetune`
    leaves it; returns its path."""
    task_name, options, data, state = TASKS.get(name, (name, {}, {}, {}))
    checkpoint = write_tiny_checkpoint(folder / "ckpt", hidden_size=16, intermediate_size=32)
    pretrained = load_pretrained(str(checkpoint), sequence_length=SEQUENCE_LENGTH)
    description = {
        "task": task_name,
        "options": options,
        "data": data,
        "state": state,
        "sequence_length": SEQUENCE_LENGTH,
        "batch_size": 4,
        "bucket_lengths": [SEQUENCE_LENGTH],
    }
    task = build_task(description, pretrained.tokenizer, folder)
    model = task.build_model(pretrained.backbone)
    run = RunDirectory(folder / "run")
    save_architecture(pretrained, run.model_dir)
    run.write_task_description(task_description(task, SEQUENCE_LENGTH, 4, [SEQUENCE_LENGTH]))
    model.save_weights(run.weights_file)
    run.recipe_file.write_text("schema: 1\n")
    run.set_status(status)
    return run.path, task, model


@pytest.fixture(scope="module", params=list(TASKS))
def exported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    run_dir, task, model = write_run(folder, request.param)
    export = export_transformers(run_dir, folder / "hf")
    return request.param, export, task, model


def inputs(task):
    """Token ids of two texts (pairs for a pair classifier, padded), as the model takes them."""
    pairs = [text[::-1] for text in TEXTS] if getattr(task.data, "text_pair", None) else None
    token_ids, segment_ids = task.tokenizer.encode(TEXTS, pairs, sequence_length=SEQUENCE_LENGTH)
    width = max(map(len, token_ids))
    batch = {
        "token_ids": np.zeros((2, width), "int32"),
        "segment_ids": np.zeros((2, width), "int32"),
        "padding_mask": np.zeros((2, width), "int32"),
    }
    for row, (ids, segments) in enumerate(zip(token_ids, segment_ids, strict=True)):
        batch["token_ids"][row, : len(ids)] = ids
        batch["segment_ids"][row, : len(ids)] = segments
        batch["padding_mask"][row, : len(ids)] = 1
    return batch


def numpy_head_logits(state, config, batch):
    """transformers' task model in NumPy: BertModel (tests/numpy_bert.py), then the head."""
    sequence, pooled = numpy_bert_forward(state, config, *batch.values())
    architecture = config["architectures"][0]
    if architecture == "BertForSequenceClassification":
        return pooled @ state["classifier.weight"].T + state["classifier.bias"]
    module = "qa_outputs" if architecture == "BertForQuestionAnswering" else "classifier"
    return sequence @ state[f"{module}.weight"].T + state[f"{module}.bias"]


def test_exported_weights_give_the_keras_models_logits(exported):
    _, export, task, model = exported
    config = json.loads((export.path / "config.json").read_text())
    state = load_file(str(export.path / "model.safetensors"))
    batch = inputs(task)
    expected = keras.ops.convert_to_numpy(model(batch, training=False))
    got = numpy_head_logits(state, config, batch)
    if task.name == "regression":  # the target statistics are folded into the head
        expected = expected * 1.5 + 2.5
        assert config["problem_type"] == "regression"
    elif task.name not in ("classification", "multi_label"):  # per token: real tokens only
        real = batch["padding_mask"].astype(bool)
        expected, got = expected[real], got[real]
    np.testing.assert_allclose(got, expected, atol=2e-5)
    if getattr(task.data, "text_pair", None):
        assert batch["segment_ids"].any()  # the pair's segment embedding is exercised


def test_bertkit_reads_the_folder_back_as_a_preset(exported):
    _, export, task, model = exported
    loaded = load_pretrained(str(export.path), sequence_length=SEQUENCE_LENGTH)
    batch = inputs(task)
    outputs = loaded.backbone(batch)
    sequence = keras.Model(model.input, model.get_layer("transformer_layer_1").output)(batch)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(outputs["sequence_output"]), sequence)
    pooled = keras.ops.convert_to_numpy(outputs["pooled_output"])
    if task.name in ("classification", "multi_label", "regression"):
        expected = keras.Model(model.input, model.get_layer("pooled_dense").output)(batch)
        np.testing.assert_array_equal(pooled, expected)
    else:  # a head without the pooler: written as zeros (bertkit.model.hf_weights)
        assert not pooled.any()
    assert loaded.hidden_act == "gelu"
    assert loaded.tokenizer.vocabulary == task.tokenizer.vocabulary
    assert loaded.tokenizer.lowercase == task.tokenizer.lowercase


def test_config_tokenizer_files_and_what_is_not_represented(exported):
    name, export, task, _ = exported
    folder = export.path
    config = json.loads((folder / "config.json").read_text())
    architecture, labels = {
        "classification": ("BertForSequenceClassification", task.state.get("labels")),
        "pairs": ("BertForSequenceClassification", task.state.get("labels")),
        "tagging": ("BertForTokenClassification", task.state.get("labels")),
        "span_qa": ("BertForQuestionAnswering", ["start", "end"]),
        "regression": ("BertForSequenceClassification", ["score"]),
        "multi_label": ("BertForSequenceClassification", task.state.get("labels")),
    }[name]
    assert config["architectures"] == [architecture]
    assert config["id2label"] == {str(i): label for i, label in enumerate(labels)}
    assert config["label2id"] == {label: i for i, label in enumerate(labels)}
    assert config["hidden_act"] == "gelu" and config["layer_norm_eps"] == 1e-12
    assert config["vocab_size"] == task.tokenizer.vocabulary_size
    assert (config["hidden_size"], config["num_hidden_layers"]) == (16, 2)
    assert config["bertkit"]["sequence_length"] == SEQUENCE_LENGTH
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["do_lower_case"] is True
    assert tokenizer_config["model_max_length"] == SEQUENCE_LENGTH
    assert json.loads((folder / "special_tokens_map.json").read_text())["cls_token"] == "[CLS]"
    assert (folder / "vocab.txt").read_text().split("\n")[:3] == ["[PAD]", "[UNK]", "[CLS]"]
    lost = config["bertkit"]["not_represented"]
    assert lost == list(export.head.not_represented)
    assert all(f"- {phrase}" in (folder / "README.md").read_text() for phrase in lost)
    assert "\n" not in export.summary and export.summary.startswith(f"exported {folder} (")
    expected_phrase = {
        "classification": "not represented: nothing",
        "pairs": "not represented: nothing",
        "tagging": "constrained iob2 decoding",
        "span_qa": "the tuned no-answer threshold 1.5 ",
        "regression": "not represented: nothing",
        "multi_label": "not represented: the tuned thresholds",
    }[name]
    assert expected_phrase in export.summary
    assert not list(folder.parent.glob(".*.partial"))


def export_command(run_dir, out, capsys) -> tuple[int, str, str]:
    code = main(["export", str(run_dir), "--out", str(out), "--format", "transformers"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_prints_one_line_and_refuses_in_one_line(tmp_path, capsys):
    run_dir, _, _ = write_run(tmp_path, "classification", status=RUNNING)
    code, _, error = export_command(run_dir, tmp_path / "out", capsys)
    assert code == 2
    assert error == (
        f"bertkit: error: {run_dir}: holds no finished run (run.json: running); "
        "export a run that bertkit finetune has finished\n"
    )
    RunDirectory(run_dir).set_status(FINISHED)
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for out, message in [
        ("file", "export path exists and is not a folder; choose another"),
        ("full", "export folder exists and is not empty; choose another"),
    ]:
        assert export_command(run_dir, tmp_path / out, capsys) == (
            2,
            "",
            f"bertkit: error: {tmp_path / out}: {message}\n",
        )
    code, printed, _ = export_command(run_dir, tmp_path / "out", capsys)
    assert (code, printed) == (
        0,
        f"exported {tmp_path / 'out'} (transformers BertForSequenceClassification); "
        "not represented: nothing\n",
    )


def test_a_masked_lm_is_refused_before_its_model_loads(tmp_path):
    """The refusal reads only task.json and the vocabulary: the weights file is empty."""
    run = RunDirectory(tmp_path / "run")
    WordPieceTokenizer(tiny_vocabulary(), lowercase=True).save(run.model_dir)
    description = {"task": "mlm", "options": {}, "data": {}, "state": {}}
    run.task_file.write_text(json.dumps({**description, "sequence_length": SEQUENCE_LENGTH}))
    run.weights_file.write_bytes(b"")
    run.recipe_file.write_text("schema: 1\n")
    run.set_status(FINISHED)
    with pytest.raises(UserError) as error:
        export_transformers(run.path, tmp_path / "out")
    assert str(error.value) == (
        f"{run.path}: a mlm model has no transformers format (its task declares no "
        "transformers head); export it as a SavedModel (without --format)"
    )
    assert not (tmp_path / "out").exists()
