"""Helpers for tests of bertkit and of task plugins: tiny checkpoints and data, offline.

Example:
    >>> import tempfile
    >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())
    >>> sorted(p.name for p in folder.iterdir())
    ['config.json', 'model.safetensors', 'tokenizer_config.json', 'vocab.txt']
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

POSITIVE = ["good", "great", "fine", "lovely", "superb", "warm", "funny", "bright"]
NEGATIVE = ["bad", "awful", "dull", "poor", "boring", "cold", "weak", "grim"]
FILLER = ["the", "a", "film", "book", "meal", "show", "was", "is", "very", "quite", "and",
          "plot", "cast", "story", "really", "ending", "of", "it", "this", "ok", "in", "at",
          "paris", "john", "smith", "london", "acme", "corp", "visited", "works", "for",
          "who", "where", "when", "did", "what", "go", "to", "."]
PIECES = ["##s", "##ed", "##ing", "##ly", "un", "##believ", "##able", ",", "!", "?", "'",
          "-", "(", ")"]


def tiny_vocabulary() -> list[str]:
    """Special tokens, the words the generated data uses, some word pieces and letters."""
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789")
    tokens = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + FILLER
              + PIECES + letters + ["##" + c for c in letters])
    return list(dict.fromkeys(tokens))


def write_tiny_checkpoint(directory, *, num_layers: int = 2, hidden_size: int = 32,
                          num_heads: int = 4, intermediate_size: int = 64,
                          max_positions: int = 128, hidden_act: str = "gelu",
                          seed: int = 0, vocabulary: list[str] | None = None,
                          **config_overrides) -> Path:
    """A random Hugging Face-format BERT folder (config.json, model.safetensors, vocab.txt).

    `config_overrides` replace or add config.json keys (e.g. `type_vocab_size=3`).
    """
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocabulary = vocabulary or tiny_vocabulary()
    config = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": len(vocabulary),
              "hidden_size": hidden_size, "num_hidden_layers": num_layers,
              "num_attention_heads": num_heads, "intermediate_size": intermediate_size,
              "hidden_act": hidden_act, "max_position_embeddings": max_positions,
              "type_vocab_size": 2, "layer_norm_eps": 1e-12, **config_overrides}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    save_file(random_bert_state(config, seed), str(directory / "model.safetensors"))
    return directory


def random_bert_state(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under Hugging Face BertModel names (Linear weights are [out, in])."""
    rng = np.random.default_rng(seed)
    hidden, inner = config["hidden_size"], config["intermediate_size"]

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def layer_norm(prefix):
        return {f"{prefix}.weight": (1 + normal(hidden)).astype(np.float32),
                f"{prefix}.bias": normal(hidden)}

    state = {"embeddings.word_embeddings.weight": normal(config["vocab_size"], hidden),
             "embeddings.position_embeddings.weight": normal(config["max_position_embeddings"],
                                                             hidden),
             "embeddings.token_type_embeddings.weight": normal(config["type_vocab_size"], hidden),
             **layer_norm("embeddings.LayerNorm"),
             "pooler.dense.weight": normal(hidden, hidden), "pooler.dense.bias": normal(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            state[f"{p}.{name}.weight"] = normal(hidden, hidden)
            state[f"{p}.{name}.bias"] = normal(hidden)
        state[f"{p}.intermediate.dense.weight"] = normal(inner, hidden)
        state[f"{p}.intermediate.dense.bias"] = normal(inner)
        state[f"{p}.output.dense.weight"] = normal(hidden, inner)
        state[f"{p}.output.dense.bias"] = normal(hidden)
        state.update(layer_norm(f"{p}.attention.output.LayerNorm"))
        state.update(layer_norm(f"{p}.output.LayerNorm"))
    return state


def sentiment_sentences(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(sentence, label) pairs whose label a small model learns in a few steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = "positive" if i % 2 == 0 else "negative"
        cue = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
        words = rng.sample(FILLER[:20], rng.randint(2, 8))
        words.insert(rng.randint(0, len(words)), cue)
        rows.append((" ".join(words).capitalize() + ".", label))
    return rows


def write_sentiment_tsv(path, count: int, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["sentence\tlabel"] + [f"{s}\t{label}" for s, label in sentiment_sentences(count, seed)]
    path.write_text("\n".join(lines) + "\n")
    return path


_FRESH_PROCESS_SCRIPT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tf-text ops the graph uses)
inputs = json.loads(sys.stdin.read())
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
outputs = serve(**{name: tf.constant(values) for name, values in inputs.items()})
loaded = sorted(m for m in ("keras_hub", "keras_nlp", "bertkit") if m in sys.modules)
def plain(value):
    value = value.numpy()
    return value.astype(str).tolist() if value.dtype.kind in "SO" else value.tolist()
print(json.dumps({"outputs": {k: plain(v) for k, v in outputs.items()}, "imported": loaded}))
"""


def serve_in_fresh_process(saved_model_dir, inputs: dict) -> dict:
    """Runs a SavedModel's `serving_default` in a new Python that imports only TensorFlow
    and tf-text; returns its outputs as lists (strings decoded).

    Raises AssertionError if keras-hub or bertkit got imported there. (Keras itself
    is always imported: `tensorflow_text` builds Keras layers at import time.)
    """
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_SCRIPT, str(saved_model_dir)],
                            input=json.dumps(inputs), capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise AssertionError(f"serving failed:\n{result.stderr[-3000:]}")
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    assert reply["imported"] == [], f"the SavedModel needed {reply['imported']}"
    return reply["outputs"]


def run_task_contract_test(task, train_file, *, inputs: list, bad_input, serving_inputs=None,
                           compare=None, task_options: dict | None = None,
                           data: dict | None = None, training: dict | None = None,
                           sequence_length: int = 32,
                           directory=None, fit_steps: int = 10, atol: float = 1e-4) -> dict:
    """Checks a task plugin end to end on a tiny random backbone, as the core drives it.

    One call, in the spirit of keras-hub's `run_task_test`, for plugin authors:

    1. the task resolves through the `bertkit.tasks` entry point and reads `train_file`;
    2. `featurize` gives rows with `token_ids` and `segment_ids` of at most
       `sequence_length` word pieces; for a task with a preprocessor
       (`Task.preprocessor`), its Python and TensorFlow paths make the same rows
       for `inputs` (`check_preprocessor`);
    3. a few `fit` steps on one repeated batch (`make_batch`, `loss`) lower the loss;
    4. `bertkit.finetune` writes a run and a SavedModel;
    5. predictions for the raw `inputs` in one batch equal those of each input
       featurized and decoded alone (padding and batching change nothing);
    6. the SavedModel, in a fresh process with only TensorFlow and tf-text, agrees
       with `predict`;
    7. `bad_input` is refused with a `UserError`.

    Args:
        task: a registered task name, or its class.
        train_file: a small labelled file in a format the task reads.
        inputs: raw inputs `FineTunedModel.predict` takes (texts, pairs, dicts).
        bad_input: an input the task must refuse with `UserError`.
        serving_inputs: name -> list of strings, the same inputs as the SavedModel
            takes them; default: `inputs` under the signature's only name.
        compare: `compare(predictions, served)` asserts that the SavedModel's
            outputs (name -> list) agree with `predict`'s; default: every output
            named like a prediction key is equal (numbers within `atol`).
        task_options, data, training: recipe `task:`, `data:` and `training:` keys
            beyond the defaults (one epoch, batch size 8).
        sequence_length: the tiny backbone's sequence length.
        directory: where to write the checkpoint and the run (default: a temporary folder).
        fit_steps: steps of the repeated-batch fit.

    Returns:
        `{"run_dir": Path, "predictions": [...], "served": {...}, "preprocessor": [...]}`
        for further checks (`preprocessor`: the names `check_preprocessor` compared).
    """
    import tempfile

    import bertkit
    from bertkit.errors import UserError
    from bertkit.registry import load_task

    name = task if isinstance(task, str) else task.name
    task_class = load_task(name)
    assert isinstance(task, str) or task_class is task, f"'{name}' names another class"
    directory = Path(directory or tempfile.mkdtemp(prefix=f"bertkit-contract-{name}-"))
    recipe = {"schema": 1, "task": {"name": name, **(task_options or {})},
              "backbone": {"preset": str(write_tiny_checkpoint(directory / "ckpt", num_layers=1)),
                           "sequence_length": sequence_length},
              "data": {"train": str(train_file), **(data or {})},
              "training": {"epochs": 1, "batch_size": 8, "learning_rate": 3e-3,
                           **(training or {})}}

    # ---- 1-3: read, featurize (both paths of a preprocessor), fit on one repeated batch
    trainer, examples, backbone = _contract_task(recipe)
    features = _check_features(trainer, examples, sequence_length)
    if serving_inputs is None:
        (signature_name,) = trainer.serving_inputs()
        serving_inputs = {signature_name: list(inputs)}
    compared = check_preprocessor(trainer, inputs, serving_inputs)
    _check_fit_lowers_the_loss(trainer, backbone, features, fit_steps)

    # ---- 4-5: a run, predictions batched and one at a time
    model = bertkit.finetune(recipe, output_dir=directory / "run", verbose=0)
    predictions = model.predict(inputs)
    alone = [model.predict([value], batch_size=1)[0] for value in inputs]
    _assert_close(predictions, alone, atol, "predict in a batch vs alone")

    # ---- 6: the SavedModel in a fresh process
    served = serve_in_fresh_process(directory / "run" / "saved_model", serving_inputs)
    (compare or _default_compare(atol))(predictions, served)

    # ---- 7: a bad input is the user's error
    try:
        model.predict([bad_input])
    except UserError:
        pass
    else:
        raise AssertionError(f"{bad_input!r} was accepted; expected a UserError")
    return {"run_dir": directory / "run", "predictions": predictions, "served": served,
            "preprocessor": compared}


def _contract_task(recipe: dict):
    from bertkit.model.backbone import load_pretrained
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import make_task

    loaded = load_recipe(recipe)
    pretrained = load_pretrained(loaded.backbone.preset,
                                 sequence_length=loaded.backbone.sequence_length)
    reader = make_task(loaded)
    examples = reader.read(loaded.data.train)
    assert examples, "read returned no examples"
    task = make_task(loaded, tokenizer=pretrained.tokenizer, state=reader.fit_state(examples))
    return task, examples, pretrained.backbone


def _check_features(task, examples: list, sequence_length: int):
    features = task.featurize(examples, training=True)
    assert len(features) > 0, "featurize gave no rows"
    assert {"token_ids", "segment_ids"} <= set(features.columns), sorted(features.columns)
    assert features.lengths().max() <= sequence_length, "a row is longer than sequence_length"
    assert len(features.example_index) == len(features)
    return features


def check_preprocessor(task, inputs: list, serving_inputs: dict | None = None) -> list[str]:
    """Checks that a task's preprocessor makes the same rows in Python and in TensorFlow.

    `task.preprocessor()` (None: nothing to check) has `featurize(examples)`, the
    Python path of training and `predict`, and `serve(inputs)`, the graph path of
    the SavedModel (see `bertkit.task.Task.preprocessor`). The raw `inputs` go
    through `task.parse_input` and `featurize`, `serving_inputs` through `serve`
    (eagerly). Every output of `serve` named like a column of the `Features`, one
    of its extras or `example_index` must hold the same values as nested lists;
    `token_ids`, `segment_ids` and `example_index` must be among them. Outputs with
    other names belong to the graph alone (byte offsets, ...).

    Args:
        task: a task instance (tokenizer and options set).
        inputs: raw inputs, as `FineTunedModel.predict` takes them.
        serving_inputs: name -> list of strings, the same inputs as the SavedModel
            takes them; default: `inputs` under the signature's only name.

    Returns:
        The names compared, in `serve`'s order: a test can require its task's
        bookkeeping among them.

    Example (a preprocessor of one row per text; both paths pack with one tokenizer):
        >>> import tensorflow as tf
        >>> from bertkit.model.tokenizer import WordPieceTokenizer
        >>> from bertkit.task import Features, Task
        >>> class OneRow:
        ...     tokenizer = WordPieceTokenizer(tiny_vocabulary(), lowercase=True)
        ...     def featurize(self, texts):
        ...         ids, segments = self.tokenizer.encode(texts, sequence_length=8)
        ...         return Features({"token_ids": ids, "segment_ids": segments},
        ...                         np.arange(len(texts)))
        ...     def serve(self, inputs):
        ...         ids, segments = self.tokenizer.pack(
        ...             [self.tokenizer.tokenize(inputs["text"])], 8)
        ...         return {"token_ids": ids, "segment_ids": segments,
        ...                 "example_index": tf.range(ids.nrows())}
        >>> class Texts(Task):
        ...     def preprocessor(self): return OneRow()
        ...     def parse_input(self, value): return value
        ...     def serving_inputs(self): return {"text": None}
        >>> check_preprocessor(Texts(None, None, None, 8), ["a good film", "bad"])
        ['token_ids', 'segment_ids', 'example_index']
    """
    import tensorflow as tf

    preprocessor = task.preprocessor()
    if preprocessor is None:
        return []
    if serving_inputs is None:
        (name,) = task.serving_inputs()
        serving_inputs = {name: list(inputs)}
    features = preprocessor.featurize([task.parse_input(value) for value in inputs])
    served = preprocessor.serve({name: tf.constant(values, tf.string)
                                 for name, values in serving_inputs.items()})
    python = {**features.columns, **features.extras, "example_index": features.example_index}
    missing = [name for name in ("token_ids", "segment_ids", "example_index") if name not in served]
    assert not missing, f"the preprocessor's serve gives no {', '.join(missing)}"
    compared = [name for name in served if name in python]
    for name in compared:
        _assert_same_rows(name, _plain(python[name]), _plain(served[name]),
                          features.example_index, inputs)
    return compared


def _assert_same_rows(name: str, python, graph, example_index, inputs: list) -> None:
    """Equal values, or an error naming the first item that differs and its input."""
    if python == graph:
        return
    where = ""
    if isinstance(python, list) and isinstance(graph, list):
        pairs = enumerate(zip(python, graph, strict=False))
        i = next((i for i, (a, b) in pairs if a != b), min(len(python), len(graph)))
        per_row = len(python) == len(example_index) and i < len(python)  # else per input
        source = example_index[i] if per_row else i
        where = (f" at item {i} (of {len(python)} from featurize, {len(graph)} from serve)"
                 + (f", from input {inputs[source]!r:.80}" if source < len(inputs) else ""))
        python, graph = python[i:i + 1], graph[i:i + 1]
    raise AssertionError(f"the preprocessor's Python and TensorFlow paths disagree on '{name}'"
                         f"{where}: featurize gives {python!r:.300}, serve {graph!r:.300}")


def _plain(value):
    """Tensors, ragged tensors, arrays and tuples as nested lists of Python values."""
    if hasattr(value, "to_list"):  # tf.RaggedTensor
        return value.to_list()
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value.item() if isinstance(value, np.generic) else value


def _check_fit_lowers_the_loss(task, backbone, features, steps: int) -> None:
    import keras

    from bertkit.padding import pad_batch

    batch = pad_batch(features, np.arange(min(8, len(features))), (features.lengths().max(),))
    inputs, targets, weights = task.make_batch(batch, training=True,
                                               rng=np.random.default_rng(0))
    model = task.build_model(backbone)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=task.loss())
    size = len(batch["token_ids"])

    def loss() -> float:  # without dropout, so that the comparison is not noise
        return model.evaluate(inputs, targets, sample_weight=weights, batch_size=size,
                              verbose=0)

    before = loss()
    model.fit(inputs, targets, sample_weight=weights, epochs=steps, batch_size=size,
              shuffle=False, verbose=0)
    after = loss()
    assert after < before, f"the loss did not go down on one repeated batch: {before} -> {after}"


def _default_compare(atol: float):
    def compare(predictions: list[dict], served: dict) -> None:
        shared = [key for key in served if isinstance(predictions[0].get(key), _SCALARS)]
        assert shared, (f"no SavedModel output ({', '.join(served)}) is named like a "
                        f"plain prediction value ({', '.join(predictions[0])}); pass compare=")
        for key in shared:
            _assert_close([p[key] for p in predictions], served[key], atol, f"output '{key}'")

    return compare


_SCALARS = (str, int, float, bool)


def _assert_close(expected, got, atol: float, what: str) -> None:
    """Equal structures and texts; numbers within `atol`."""
    np.testing.assert_equal(_strings(got), _strings(expected), err_msg=what)
    np.testing.assert_allclose(_numbers(got), _numbers(expected), atol=atol, err_msg=what)


def _strings(value):
    """Nested structures with floats rounded away, to compare everything else exactly."""
    if isinstance(value, dict):
        return {key: _strings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strings(item) for item in value]
    return "<number>" if isinstance(value, float) else value


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [number for item in value.values() for number in _numbers(item)]
    if isinstance(value, (list, tuple)):
        return [number for item in value for number in _numbers(item)]
    return [float(value)] if isinstance(value, (int, float)) else []


_BAD_REQUESTS_SCRIPT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
names, example = json.loads(sys.argv[2]), json.loads(sys.argv[3])
report = {}
for case, value in (("scalar", example), ("matrix", [[example, example]]), ("empty", [])):
    try:
        tensors = {name: tf.constant(value, dtype=tf.string) for name in names}
        outputs = serve(**tensors)
        report[case] = {key: [str(v.dtype.name), v.shape.as_list()] for key, v in outputs.items()}
    except tf.errors.InvalidArgumentError as error:
        report[case] = "InvalidArgumentError: " + error.message[:3000]
one = serve(**{name: tf.constant([example]) for name in names})
report["one"] = {key: [str(v.dtype.name), v.shape.as_list()] for key, v in one.items()}
print(json.dumps(report))
"""


def serve_bad_requests(saved_model_dir, names: list[str], example: str = "[MASK] is here") -> dict:
    """Calls a SavedModel in a fresh process with a scalar, a 2-D input and an empty batch
    (`example` in each of the inputs `names`), and one good row; returns for each case the
    outputs' {name: [dtype, shape]}, or the InvalidArgumentError's message."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", _BAD_REQUESTS_SCRIPT, str(saved_model_dir),
                             json.dumps(names), json.dumps(example)],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise AssertionError(f"serving crashed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_serving_refuses_bad_shapes(saved_model_dir, names: list[str], **kwargs) -> None:
    """A scalar or 2-D input is an error naming the input; an empty batch gives empty
    outputs of the dtypes and inner shapes of a one-row batch."""
    report = serve_bad_requests(saved_model_dir, names, **kwargs)
    for case in ("scalar", "matrix"):
        assert isinstance(report[case], str), (case, report[case])
        assert f"input {names[0]} must be a 1-D batch of strings" in report[case], report[case]
    assert set(report["empty"]) == set(report["one"])
    for key, (dtype, shape) in report["empty"].items():
        one_dtype, one_shape = report["one"][key]
        assert dtype == one_dtype and shape[0] == 0 and one_shape[0] == 1, (key, report)
