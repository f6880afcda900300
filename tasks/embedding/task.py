"""Sentence embeddings: a bi-encoder trained contrastively, as sentence-transformers trains."""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.task import DataFiles, Task, string_inputs
from bertkit_tasks.embedding.pairs import (
    TEXTS,
    PairExample,
    pair_features,
    read_pairs,
    read_scored_pairs,
)


@dataclasses.dataclass(frozen=True)
class EmbeddingOptions:
    loss: Literal["mnrl", "cosine"] = dataclasses.field(
        default="mnrl",
        metadata={
            "help": "mnrl: in-batch negatives over (anchor, positive[, negative]) pairs; "
            "cosine: cosine similarity regressed on scored pairs"
        },
    )
    scale: float = dataclasses.field(
        default=20.0,
        metadata={"min_exclusive": 0.0, "help": "mnrl: the factor of the cosine similarities"},
    )
    pooling: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "cls, mean, max, mean_sqrt_len, or several joined by +; default: what a "
            "sentence-transformers checkpoint declares, else mean"
        },
    )
    normalize: bool | None = dataclasses.field(
        default=None,
        metadata={"help": "unit-length vectors; default: what the checkpoint declares, else no"},
    )


@dataclasses.dataclass(frozen=True)
class EmbeddingData(DataFiles):
    anchor: str = dataclasses.field(default="anchor", metadata={"help": "mnrl: the query text"})
    positive: str = dataclasses.field(default="positive", metadata={"help": "mnrl: its match"})
    negative: str | None = dataclasses.field(
        default="negative", metadata={"help": "mnrl: a hard negative, used if the file has it"}
    )
    text: str = dataclasses.field(default="text", metadata={"help": "cosine: the first text"})
    text_pair: str = dataclasses.field(default="text_pair", metadata={"help": "cosine: the second"})
    score: str = dataclasses.field(default="score", metadata={"help": "cosine: their similarity"})
    score_min: float = dataclasses.field(default=0.0, metadata={"help": "cosine: the lowest score"})
    score_max: float = dataclasses.field(default=1.0, metadata={"help": "cosine: the highest"})


class EmbeddingTask(Task):
    """Fine-tunes a sentence encoder on text pairs; predictions are `{"embedding": [...]}`.

    `loss: mnrl` (default) is sentence-transformers' MultipleNegativesRankingLoss: each
    anchor against every positive (and hard negative) of its batch, validated as retrieval
    of each anchor's positive among the split's positives (MRR@10, recall@1, recall@10).
    `loss: cosine` is its CosineSimilarityLoss on scored pairs, validated by Spearman's and
    Pearson's correlation of cosine and score. Pooling and normalization are `bertkit
    embed`'s (`bertkit.model.pooling`), inside the model and the exported SavedModel.

    The batch is mnrl's set of negatives, so `loss_spans_batch`: micro-batches are refused,
    and so are several TensorFlow devices (each replica's loss would see its own shard); on
    JAX the loss of a data-parallel batch is the whole batch's. The batch order is the
    recipe's: the default draws rows at random, as sentence-transformers does;
    `batch_order: length_buckets` draws a batch's rows among rows of one padded length, so
    negatives are of similar length, which makes length no cue (not easier negatives).
    """

    name = "embedding"
    description = "Sentence embeddings from text pairs: in-batch negatives or cosine (MRR, rho)."
    Options = EmbeddingOptions
    Data = EmbeddingData
    Example = PairExample
    monitor = "mrr_at_10"
    int8_max_drop = 1.0  # points of MRR@10 (or Spearman)
    packs = False  # a row is several texts, each through the encoder on its own

    def __init__(self, options, data, tokenizer, sequence_length, state=None, **kwargs):
        super().__init__(options, data, tokenizer, sequence_length, state, **kwargs)
        if options.loss == "cosine":
            self.monitor = "spearman"  # the core (seeds, tune too) reads an instance's monitor

    @classmethod
    def loss_spans_batch(cls, options) -> bool:
        return options.loss == "mnrl"

    # ---- data
    def read(self, path):
        reader = read_scored_pairs if self.options.loss == "cosine" else read_pairs
        return reader(path, self.data)

    def fit_state(self, train_examples):
        from bertkit.model.backbone import resolve_preset
        from bertkit.model.embedding_settings import declared_settings, parse_poolings
        from bertkit.serving.embedder import DEFAULT_POOLING

        declared = declared_settings(_folder(resolve_preset(self.backbone_preset or "")))
        poolings = declared.poolings or DEFAULT_POOLING
        if self.options.pooling is not None:
            poolings = parse_poolings(self.options.pooling, source="task.pooling")
        normalize = self.options.normalize
        texts = 3 if any(e.negative is not None for e in train_examples) else 2
        return {
            "poolings": list(poolings),
            "normalize": bool(declared.normalize if normalize is None else normalize),
            "texts": texts,
        }

    @property
    def texts(self) -> tuple[str, ...]:
        return TEXTS[: self.state["texts"]]

    def featurize(self, examples, training):
        return pair_features(self.tokenizer, examples, len(self.texts), self.sequence_length)

    def make_batch(self, batch, training, rng):
        inputs = {
            "token_ids": batch["token_ids"],
            "segment_ids": batch["segment_ids"],
            "padding_mask": batch["anchor_mask"],
        }
        for text in self.texts[1:]:
            token_ids, mask = batch[f"{text}_token_ids"], batch[f"{text}_mask"]
            if not mask.any():  # none given (predict): one padding token, not a row's width
                token_ids, mask = token_ids[:, :1], mask[:, :1]
            inputs[f"{text}_token_ids"], inputs[f"{text}_padding_mask"] = token_ids, mask
        if self.options.loss == "cosine":
            return inputs, batch["scores"], None
        keys = np.stack([batch["positive_key"], batch["row_index"]], axis=1)
        return inputs, keys.astype(np.float32), None

    # ---- model
    def build_model(self, backbone):
        from bertkit_tasks.embedding.bi_encoder import bi_encoder, sentence_encoder

        poolings = tuple(self.state["poolings"])
        return bi_encoder(sentence_encoder(backbone, poolings, self.state["normalize"]), self.texts)

    def loss(self):
        from bertkit_tasks.embedding.losses import (
            CosineSimilarityLoss,
            MultipleNegativesRankingLoss,
        )

        if self.options.loss == "cosine":
            return CosineSimilarityLoss()
        return MultipleNegativesRankingLoss(self.options.scale)

    # ---- outputs
    def decode(self, examples, features, outputs):
        vectors = outputs["logits"]  # per row: (texts, dim)
        return [
            {"embedding": row[0].tolist()}
            | ({"positive_embedding": row[1].tolist()} if example.positive is not None else {})
            for example, row in zip(examples, vectors, strict=True)
        ]

    def evaluate(self, examples, predictions):
        from bertkit.metrics.correlation import pearson, spearman
        from bertkit_tasks.embedding.retrieval_metrics import paired_cosines, retrieval_metrics

        anchors = np.array([p["embedding"] for p in predictions])
        positives = np.array([p["positive_embedding"] for p in predictions])
        if self.options.loss == "cosine":
            cosines = paired_cosines(anchors, positives)
            gold = np.array([e.score for e in examples])
            return {"spearman": spearman(cosines, gold), "pearson": pearson(cosines, gold)}
        corpus = {}  # each distinct positive text once: the split's documents
        gold = np.array([corpus.setdefault(e.positive, len(corpus)) for e in examples])
        first = [int(np.flatnonzero(gold == document)[0]) for document in range(len(corpus))]
        return retrieval_metrics(anchors, positives[first], gold)

    def baseline(self, examples):
        """The `monitor` of learning nothing: MRR@10 of a random ranking of the split's
        distinct positives, or no correlation.

        Example:
            >>> task = EmbeddingTask(EmbeddingOptions(), EmbeddingData(), None, 8)
            >>> task.baseline([PairExample("q", "a"), PairExample("r", "b")])  # (1 + 1/2) / 2
            (0.75, 'random-ranking')
        """
        if self.options.loss == "cosine":
            return 0.0, "uncorrelated"
        documents = len({e.positive for e in examples})
        ranks = range(1, min(10, documents) + 1)
        return sum(1 / rank for rank in ranks) / documents, "random-ranking"

    def parse_input(self, value):
        if isinstance(value, dict):
            value = value.get("text")
        if not isinstance(value, str):
            raise UserError(f"expected a text or an object with 'text', got {value!r:.80}")
        return PairExample(value)

    # ---- export
    def serving_inputs(self):
        return string_inputs("text")

    def serve(self, model, inputs):
        from bertkit_tasks.embedding.bi_encoder import ENCODER_NAME

        model_inputs = self.tokenizer.model_inputs([inputs["text"]], self.sequence_length)
        return {"embedding": model.get_layer(ENCODER_NAME)(model_inputs, training=False)}


def _folder(preset: str):
    from pathlib import Path

    path = Path(preset).expanduser() if preset else None
    return path if path is not None and path.is_dir() else None
