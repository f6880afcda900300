"""BERT as features: sentence vectors and word-piece vectors from any backbone or run.

`Embedder.load(SOURCE)` takes what a recipe's `backbone.preset` takes (a keras-hub preset, a
Hugging Face folder, a Google checkpoint, `package:MODULE/FOLDER`) or a finished run directory
(its fine-tuned encoder). Texts are tokenized as training does, sorted by length into
batches padded to their own longest row, and the chosen hidden layers are pooled
(`bertkit.model.pooling`). A sentence-transformers folder's own pooling and normalization are
the defaults, so all-MiniLM-L6-v2 gives `SentenceTransformer.encode`'s vectors.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.model.embedding_settings import (
    COMBINES,
    EmbeddingSettings,
    declared_settings,
    parse_layers,
    parse_poolings,
)

DEFAULT_POOLING = ("mean",)  # sentence-transformers' default for a plain transformers model


@dataclasses.dataclass
class Embedder:
    """Turns texts into vectors; get one with `Embedder.load` (or `bertkit.embed`).

    Example:
        >>> import tempfile
        >>> from bertkit.testing.tiny import write_tiny_checkpoint
        >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())  # 2 layers, hidden size 32
        >>> embedder = Embedder.load(folder, pooling="mean", layers="-2:")
        >>> embedder.embed(["a fine film", "dull"]).shape  # two layers, concatenated
        (2, 64)
        >>> [piece["token"] for piece in embedder.embed_tokens(["a film"])[0]]
        ['a', 'film']
    """

    hidden_states: object  # keras.Model: token ids, segment ids, padding mask -> layers
    tokenizer: object  # bertkit.model.tokenizer.WordPieceTokenizer
    poolings: tuple[str, ...]
    layers: tuple[int, ...]
    combine: str
    normalize: bool
    sequence_length: int

    @classmethod
    def load(
        cls,
        source,
        *,
        pooling=None,
        layers=None,
        combine: str = "concat",
        normalize: bool | None = None,
        sequence_length: int | None = None,
    ) -> Embedder:
        """An embedder over `source`'s encoder.

        Args:
            source: a backbone preset (as `backbone.preset` takes it) or a run directory.
            pooling: `cls`, `mean`, `max`, `mean_sqrt_len`, several joined by `+`, or a
                tuple of them; default: what a sentence-transformers folder declares,
                else `mean`.
            layers: hidden layers to read (`parse_layers`: `-1`, `-4:`, `-4,-3,-2,-1`);
                default: the last.
            combine: `concat` or `mean` of several layers.
            normalize: vectors of length 1; default: what the folder declares, else no.
            sequence_length: word pieces per text, [CLS] and [SEP] included (longer texts
                are cut); default: the folder's `max_seq_length`, a run's, or the model's.
        """
        if combine not in COMBINES:
            raise UserError(f"unknown combine {combine!r}; choose from {', '.join(COMBINES)}")
        model, tokenizer, declared, num_layers, positions = _encoder(source)
        if isinstance(pooling, str):
            pooling = parse_poolings(pooling)
        length = _checked_length(sequence_length or declared.sequence_length, positions)
        chosen = parse_layers(layers, num_layers)
        return cls(
            _hidden_state_model(model, chosen),
            tokenizer,
            tuple(pooling or declared.poolings or DEFAULT_POOLING),
            chosen,
            combine,
            bool(declared.normalize if normalize is None else normalize),
            length,
        )

    @property
    def dimension(self) -> int:
        """The length of each vector."""
        width = self.hidden_states.output[0].shape[-1]
        return width * (len(self.layers) if self.combine == "concat" else 1) * len(self.poolings)

    def embed(self, texts, batch_size: int = 32, progress=None) -> np.ndarray:
        """One float32 vector per text, `(len(texts), dimension)`, in input order;
        `progress(done)` is called after each batch."""
        from bertkit.model.pooling import l2_normalize, pool

        texts = _checked_texts(texts)
        vectors = np.zeros((len(texts), self.dimension), np.float32)
        for rows, inputs, states in self._batches(texts, batch_size, progress):
            pooled = pool(states, inputs["padding_mask"], self.poolings)
            vectors[rows] = np.asarray(l2_normalize(pooled) if self.normalize else pooled)
        return vectors

    def embed_tokens(self, texts, batch_size: int = 32) -> list[list[dict]]:
        """For each text, its word pieces (the ones inside `sequence_length`, without
        [CLS] and [SEP]): `{"token", "start", "end", "embedding"}`, offsets in characters."""
        texts = _checked_texts(texts)
        pieces = _word_pieces(self.tokenizer, texts, self.sequence_length - 2)
        found: list = [None] * len(texts)
        for rows, _, states in self._batches(texts, batch_size, None):
            for row, vectors in zip(rows, np.asarray(states), strict=True):
                found[row] = [
                    {**piece, "embedding": vectors[1 + position]}
                    for position, piece in enumerate(pieces[row])
                ]
        return found

    def _batches(self, texts: list, batch_size: int, progress):
        """(row indices, padded inputs, combined hidden states) by batches of similar length."""
        from bertkit.model.pooling import combine_layers

        token_ids, segment_ids = self.tokenizer.encode(texts, sequence_length=self.sequence_length)
        order = np.argsort([len(ids) for ids in token_ids], kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            inputs = _padded([token_ids[i] for i in rows], [segment_ids[i] for i in rows])
            states = self.hidden_states.predict_on_batch(inputs)
            states = list(states) if isinstance(states, list | tuple) else [states]
            yield rows, inputs, combine_layers(states, self.combine)
            if progress is not None:
                progress(min(start + batch_size, len(order)))


def _checked_length(length: int | None, positions: int) -> int:
    length = length or positions
    if not 2 < length <= positions:
        raise UserError(
            f"sequence length {length}: expected 3 to the model's {positions} positions"
        )
    return length


def _encoder(source):
    """(task or backbone model, tokenizer, declared settings, layers, positions) of `source`."""
    from bertkit.model.backbone import load_pretrained, resolve_preset

    if (Path(str(source)) / "run.json").is_file():
        return _run_encoder(source)
    folder = Path(resolve_preset(str(source), source="embed")).expanduser()
    declared = declared_settings(folder) if folder.is_dir() else EmbeddingSettings()
    loaded = load_pretrained(str(source), sequence_length=1, source="embed")
    backbone = loaded.backbone
    num_layers, positions = backbone.num_layers, backbone.max_sequence_length
    return backbone, loaded.tokenizer, declared, num_layers, positions


def _run_encoder(run_dir):
    """A finished run's fine-tuned encoder: its task model holds the backbone's layers."""
    from bertkit.run_dir import RunDirectory
    from bertkit.serving.finetuned import FineTunedModel

    RunDirectory.open(run_dir)  # a wrong or unfinished run is one line before Keras loads
    fine_tuned = FineTunedModel.load(run_dir)
    model, state = fine_tuned.model, fine_tuned.task.state
    if _SENTENCE_ENCODER in {layer.name for layer in model.layers}:  # the embedding task's
        model = model.get_layer(_SENTENCE_ENCODER)  # backbone -> its pooling, trained
    num_layers = sum(layer.name.startswith("transformer_layer_") for layer in model.layers)
    positions = model.get_layer("position_embedding").get_config()["sequence_length"]
    declared = EmbeddingSettings(
        tuple(state["poolings"]) if "poolings" in state else None,
        state.get("normalize"),
        fine_tuned.description["sequence_length"],
    )
    return model, fine_tuned.task.tokenizer, declared, num_layers, positions


_SENTENCE_ENCODER = "sentence_encoder"  # bertkit_tasks.embedding.bi_encoder.ENCODER_NAME


def _hidden_state_model(model, layers: tuple[int, ...]):
    """A model from the encoder's inputs to its hidden layers `layers` (0: embeddings)."""
    import keras

    def output(index: int):
        name = "embeddings_dropout" if index == 0 else f"transformer_layer_{index - 1}"
        return model.get_layer(name).output

    inputs = {name: model.input[name] for name in ("token_ids", "segment_ids", "padding_mask")}
    return keras.Model(inputs, [output(index) for index in layers])


def _padded(token_ids: list, segment_ids: list) -> dict:
    width = max(len(ids) for ids in token_ids)
    padded = {name: np.zeros((len(token_ids), width), np.int32) for name in _INPUT_NAMES}
    for row, (ids, segments) in enumerate(zip(token_ids, segment_ids, strict=True)):
        padded["token_ids"][row, : len(ids)] = ids
        padded["segment_ids"][row, : len(ids)] = segments
        padded["padding_mask"][row, : len(ids)] = 1
    return padded


_INPUT_NAMES = ("token_ids", "segment_ids", "padding_mask")


def _word_pieces(tokenizer, texts: list, max_pieces: int) -> list[list[dict]]:
    """Each text's first `max_pieces` word pieces with their character offsets."""
    import tensorflow as tf

    from bertkit.model.tokenizer import character_offsets

    ids, byte_starts, byte_ends = tokenizer.tokenize_with_offsets(tf.constant(texts))
    found = []
    for text, row, starts, ends in zip(
        texts, ids.to_list(), byte_starts.to_list(), byte_ends.to_list(), strict=True
    ):
        char_starts, char_ends = character_offsets(text, starts, ends)
        found.append(
            [
                {"token": tokenizer.vocabulary[i], "start": int(s), "end": int(e)}
                for i, s, e in zip(row, char_starts, char_ends, strict=True)
            ][:max_pieces]
        )
    return found


def _checked_texts(texts) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise UserError("no texts to embed")
    for number, text in enumerate(texts, 1):
        if not isinstance(text, str):
            raise UserError(f"expected a text, got {text!r:.40}", source=f"input {number}")
    return texts
