"""Tiny, offline stand-ins for real inputs: a vocabulary, a random BERT checkpoint, and
sentiment data a small model learns in a few steps.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> rows = write_sentiment_tsv(Path(tempfile.mkdtemp()) / "train.tsv", 4).read_text()
    >>> rows.splitlines()[0], len(rows.splitlines())
    ('sentence\\tlabel', 5)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

POSITIVE = ["good", "great", "fine", "lovely", "superb", "warm", "funny", "bright"]
NEGATIVE = ["bad", "awful", "dull", "poor", "boring", "cold", "weak", "grim"]
FILLER = [
    "the",
    "a",
    "film",
    "book",
    "meal",
    "show",
    "was",
    "is",
    "very",
    "quite",
    "and",
    "plot",
    "cast",
    "story",
    "really",
    "ending",
    "of",
    "it",
    "this",
    "ok",
    "in",
    "at",
    "paris",
    "john",
    "smith",
    "london",
    "acme",
    "corp",
    "visited",
    "works",
    "for",
    "who",
    "where",
    "when",
    "did",
    "what",
    "go",
    "to",
    ".",
]
PIECES = [
    "##s",
    "##ed",
    "##ing",
    "##ly",
    "un",
    "##believ",
    "##able",
    ",",
    "!",
    "?",
    "'",
    "-",
    "(",
    ")",
]


def tiny_vocabulary() -> list[str]:
    """Special tokens, the words the generated data uses, some word pieces and letters."""
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789")
    tokens = (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        + POSITIVE
        + NEGATIVE
        + FILLER
        + PIECES
        + letters
        + ["##" + c for c in letters]
    )
    return list(dict.fromkeys(tokens))


def write_tiny_checkpoint(
    directory,
    *,
    num_layers: int = 2,
    hidden_size: int = 32,
    num_heads: int = 4,
    intermediate_size: int = 64,
    max_positions: int = 128,
    hidden_act: str = "gelu",
    seed: int = 0,
    vocabulary: list[str] | None = None,
    **config_overrides,
) -> Path:
    """A random Hugging Face-format BERT folder (config.json, model.safetensors, vocab.txt).

    `config_overrides` replace or add config.json keys (e.g. `type_vocab_size=3`).
    """
    vocabulary = vocabulary or tiny_vocabulary()
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "vocab_size": len(vocabulary),
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": intermediate_size,
        "hidden_act": hidden_act,
        "max_position_embeddings": max_positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        **config_overrides,
    }
    return _write_hf_folder(Path(directory), config, vocabulary, seed)


def _write_hf_folder(directory: Path, config: dict, vocabulary: list[str], seed: int) -> Path:
    """Writes `config`, `vocabulary` and random weights (`random_bert_state`) into
    `directory`, made if need be, as Hugging Face names them."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
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
        return {
            f"{prefix}.weight": (1 + normal(hidden)).astype(np.float32),
            f"{prefix}.bias": normal(hidden),
        }

    state = {
        "embeddings.word_embeddings.weight": normal(config["vocab_size"], hidden),
        "embeddings.position_embeddings.weight": normal(config["max_position_embeddings"], hidden),
        "embeddings.token_type_embeddings.weight": normal(config["type_vocab_size"], hidden),
        **layer_norm("embeddings.LayerNorm"),
        "pooler.dense.weight": normal(hidden, hidden),
        "pooler.dense.bias": normal(hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
        ):
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
    """`count` rows of `sentiment_sentences` under a `sentence\\tlabel` header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["sentence\tlabel"] + [f"{s}\t{label}" for s, label in sentiment_sentences(count, seed)]
    path.write_text("\n".join(lines) + "\n")
    return path
