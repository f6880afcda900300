"""`bertkit serve SOURCE --embed`: any backbone preset or run served as a sentence encoder.

`EmbeddingService` gives an `Embedder` (`bertkit embed`'s, with the pooling and normalization a
sentence-transformers folder declares) the face `bertkit serve` serves a fine-tuned model
by: inputs checked as `predict` checks texts, batched predictions `{"embedding": [...]}`,
and the task name `embedding`, which adds the `POST /embed` and `POST /v1/embeddings` routes.
"""

from __future__ import annotations

import types
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, input_text
from bertkit.serving.prepared import PreparedRequest


class EmbeddingService:
    """An `Embedder` as `bertkit serve` serves a model (see the module docstring)."""

    takes_text_pairs = False

    def __init__(self, embedder, source):
        self.embedder, self.source = embedder, str(source)
        self.name = Path(self.source.rstrip("/")).name or self.source
        self.task = types.SimpleNamespace(
            name="embedding", predict_options=(), tokenizer=embedder.tokenizer
        )
        self.description = {"sequence_length": embedder.sequence_length}

    @classmethod
    def load(cls, source) -> EmbeddingService:
        from bertkit.serving.embedder import Embedder

        return cls(Embedder.load(source), source)

    def parse_inputs(self, inputs: list, *, max_input_characters: int = MAX_INPUT_CHARACTERS):
        """The texts of `inputs`; the first that is not one is a `UserError` naming it."""
        texts = []
        for number, value in enumerate(inputs, 1):
            where = f"input {number}"
            if isinstance(value, str) and not value.strip():
                raise UserError("empty input", source=where)
            try:
                text = input_text(value, "text")
            except UserError as error:
                raise UserError(error.message, source=where) from None
            if "\0" in text:
                raise UserError("a NUL byte (binary data?); expected text", source=where)
            if len(text) > max_input_characters:
                raise UserError(
                    f"longer than {max_input_characters:,} characters ({len(text):,}), the "
                    "limit per input",
                    source=where,
                )
            texts.append(text)
        return texts

    def predict_examples(self, texts: list, batch_size: int | None = None) -> list[dict]:
        vectors = self.embedder.embed(texts, batch_size or 32)
        return [{"embedding": vector.tolist()} for vector in vectors]

    # A server's three stages (`bertkit.serving.prepared`): the encoder tokenizes in its
    # own call, so a prepared request is its texts.
    def prepare(self, texts: list):
        return PreparedRequest(texts, None)

    def run_prepared(self, requests: list, batch_size: int | None = None) -> list:
        texts = [text for request in requests for text in request.examples]
        vectors = iter(self.embedder.embed(texts, batch_size or 32) if texts else [])
        return [[next(vectors) for _ in request.examples] for request in requests]

    def finish(self, request, vectors: list) -> list[dict]:
        return [{"embedding": vector.tolist()} for vector in vectors]

    def metadata(self, limits: dict) -> dict:
        """What `GET /metadata` answers for a served encoder."""
        embedder = self.embedder
        return {
            "task": "embedding",
            "source": self.source,
            "pooling": "+".join(embedder.poolings),
            "layers": list(embedder.layers),
            "normalize": embedder.normalize,
            "dimension": embedder.dimension,
            "sequence_length": embedder.sequence_length,
            "limits": limits,
        }
