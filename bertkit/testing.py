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
