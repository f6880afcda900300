"""Serve an ONNX folder of `bertkit export RUN --format onnx` without TensorFlow.

The folder holds `model.onnx` (token ids in, logits out), the tokenizer files (`vocab.txt`,
bertkit's `tokenizer.json`) and `bertkit_onnx.json` (the task as the run saved it: options,
labels, sequence length, decoding settings). `OnnxModel` reads them with `onnxruntime`,
`tokenizers` and NumPy (the `onnx` extra), tokenizes as bertkit does
(`bertkit.serving.onnx_tokenizer`), runs the model and decodes the logits into the JSON
`bertkit predict` prints (`bertkit.serving.onnx_decoding`), for classification, tagging and
span QA. It imports bertkit's task classes for their input rules (`parse_input`) and
TensorFlow-free pieces (windows, tag schemes); neither TensorFlow nor Keras is imported.

Example:
    >>> model = OnnxModel.load("exported/sst2-onnx")           # doctest: +SKIP
    >>> model.predict(["a warm, funny film"])[0]["label"]     # doctest: +SKIP
    'positive'
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from bertkit.errors import UserError
from bertkit.features import Features
from bertkit.files import MAX_INPUT_CHARACTERS
from bertkit.serving import onnx_decoding as decoding
from bertkit.serving.inputs import parse_inputs
from bertkit.serving.onnx_tokenizer import PieceTokenizer
from bertkit.serving.run_task import build_task

MODEL_FILE = "model.onnx"
METADATA_FILE = "bertkit_onnx.json"
INPUT_NAMES = ("token_ids", "segment_ids", "padding_mask")
TASKS = ("classification", "tagging", "span_qa")  # the tasks decoded here
ROWS_PER_CALL = 32


class OnnxModel:
    """An exported ONNX folder, loaded: `predict` as `FineTunedModel.predict` answers.

    Args:
        session: an `onnxruntime.InferenceSession` of the folder's model.
        task: the run's task, built over `tokenizer`.
        tokenizer: a `PieceTokenizer` of the folder's vocabulary.
        metadata: `bertkit_onnx.json`.
    """

    def __init__(self, session, task, tokenizer: PieceTokenizer, metadata: dict):
        self.session, self.task, self.tokenizer, self.metadata = session, task, tokenizer, metadata

    @classmethod
    def load(cls, directory, threads: int | None = None) -> OnnxModel:
        """The folder's model, on `threads` CPU threads (default: onnxruntime's, all cores)."""
        import onnxruntime

        directory = Path(directory)
        try:
            metadata = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UserError(
                f"holds no readable {METADATA_FILE}: not a bertkit ONNX export", source=directory
            ) from None
        if metadata["task"]["task"] not in TASKS:
            raise UserError(f"a {metadata['task']['task']} model has no ONNX decoder here")
        tokenizer = PieceTokenizer.load(directory)
        task = build_task(metadata["task"], tokenizer, directory / METADATA_FILE)
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(
            str(directory / metadata.get("model_file", MODEL_FILE)),
            options,
            providers=["CPUExecutionProvider"],
        )
        return cls(session, task, tokenizer, metadata)

    def predict(self, inputs, max_input_characters: int = MAX_INPUT_CHARACTERS) -> list[dict]:
        """Predictions for raw inputs (texts, pairs, objects, as `bertkit predict` takes
        them); an invalid input is a `UserError` naming it (`input 2: empty input`)."""
        if isinstance(inputs, str):
            inputs = [inputs]
        examples = parse_inputs(self.task, list(inputs), max_input_characters)
        if not examples:
            return []
        rows = self.featurize(examples)
        return self.decode(examples, rows, self.logits(rows.token_ids, rows.segment_ids))

    # Prediction in three stages, as a server runs them (`bertkit.serving.onnx_service`):
    # featurize (any thread), logits (the model's), decode (any thread).
    def featurize(self, examples: list) -> OnnxRows:
        """The examples' model rows, and what decoding their logits needs."""
        return {
            "classification": self._classification_rows,
            "tagging": self._tagging_rows,
            "span_qa": self._span_rows,
        }[self.task.name](examples)

    def logits(
        self, token_ids: list, segment_ids: list, rows_per_call: int = ROWS_PER_CALL
    ) -> list[np.ndarray]:
        """The model's logits for rows of different lengths, each cut to its row's length
        (classification: one (labels,) array a row), `rows_per_call` rows a call."""
        outputs = []
        for first in range(0, len(token_ids), rows_per_call):
            batch = padded_batch(
                token_ids[first : first + rows_per_call],
                segment_ids[first : first + rows_per_call],
                self.tokenizer.pad_id,
            )
            (logits,) = self.session.run(None, batch)
            lengths = batch["padding_mask"].sum(axis=1)
            for row, length in zip(logits, lengths, strict=True):
                outputs.append(row if row.ndim == 1 else row[:length])
        return outputs

    def decode(self, examples: list, rows: OnnxRows, logits: list) -> list[dict]:
        """The examples' predictions from their rows' `logits`, as `predict` gives them."""
        return {
            "classification": self._classify,
            "tagging": self._tag,
            "span_qa": self._answer,
        }[self.task.name](examples, rows, logits)

    # ---- the tasks
    def _classification_rows(self, examples: list) -> OnnxRows:
        texts = self.tokenizer.pieces([e.text for e in examples])
        pairs = [e.text_pair for e in examples]
        pair_pieces = self.tokenizer.pieces(pairs) if pairs[0] is not None else None
        rows = [
            self.tokenizer.pack(
                [text.ids] + ([pair_pieces[i].ids] if pair_pieces else []),
                self.task.sequence_length,
            )
            for i, text in enumerate(texts)
        ]
        return OnnxRows([r[0] for r in rows], [r[1] for r in rows])

    def _classify(self, examples: list, rows: OnnxRows, logits: list) -> list[dict]:
        features = Features({"token_ids": rows.token_ids}, np.arange(len(rows.token_ids)))
        return self.task.decode(examples, features, {"logits": logits})  # NumPy only

    def _tagging_rows(self, examples: list) -> OnnxRows:
        preprocessor = self.task.preprocessor()  # its windows are NumPy (`rows`)
        limit, rule = preprocessor.max_word_pieces, self.task.text_words
        texts = [i for i, e in enumerate(examples) if e.text is not None]
        word_pieces = [None] * len(examples)
        for i, words in zip(
            texts, self.tokenizer.words([examples[i].text for i in texts], rule, limit), strict=True
        ):
            word_pieces[i] = words
        for i, example in enumerate(examples):
            if example.text is None:
                word_pieces[i] = (
                    *self.tokenizer.word_list_pieces(list(example.words), limit),
                    None,
                )
        features = preprocessor.rows(word_pieces)
        columns = features.columns
        return OnnxRows(columns["token_ids"], columns["segment_ids"], features)

    def _tag(self, examples: list, rows: OnnxRows, logits: list) -> list[dict]:
        extras = rows.decoding.extras
        return [
            decoding.tagging_prediction(
                example,
                chars,
                decoding.word_probabilities(logits, read_at),
                self.task.labels,
                self.task.allowed_transitions,
            )
            for example, chars, read_at in zip(
                examples, extras["char_offsets"], extras["read_at"], strict=True
            )
        ]

    def _span_rows(self, examples: list) -> OnnxRows:
        options = self.task.options
        questions = self.tokenizer.pieces([e.question for e in examples])
        contexts = self.tokenizer.pieces([e.context for e in examples])
        windows = [
            decoding.question_rows(
                question.ids[: options.max_query_length],
                context,
                self.tokenizer,
                self.task.sequence_length,
                options.doc_stride,
            )
            for question, context in zip(questions, contexts, strict=True)
        ]
        flat = [row for example_rows in windows for row in example_rows]
        return OnnxRows([r["token_ids"] for r in flat], [r["segment_ids"] for r in flat], windows)

    def _answer(self, examples: list, rows: OnnxRows, logits: list) -> list[dict]:
        options = self.task.options
        predictions, first = [], 0
        for example, example_rows in zip(examples, rows.decoding, strict=True):
            window_logits = logits[first : first + len(example_rows)]
            first += len(example_rows)
            decoded = decoding.best_spans(
                window_logits, example_rows, options.max_answer_length, options.n_best_size
            )
            predictions.append(decoding.span_prediction(example, example_rows, decoded, self.task))
        return predictions


@dataclasses.dataclass
class OnnxRows:
    """Examples' model rows (unpadded ids) and what decoding needs beside the logits:
    tagging's `Features` (character offsets, where each word is read), span QA's windows
    per example; nothing for classification."""

    token_ids: list
    segment_ids: list
    decoding: object = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def longest(self) -> int:
        return max((len(ids) for ids in self.token_ids), default=0)


def padded_batch(token_ids: list, segment_ids: list, pad_id: int) -> dict:
    """Rows of int32 ids padded to the longest: the model's three (rows, longest) inputs."""
    width = max(len(ids) for ids in token_ids)
    batch = {name: np.zeros((len(token_ids), width), np.int32) for name in INPUT_NAMES}
    batch["token_ids"][:] = pad_id
    for row, (ids, segments) in enumerate(zip(token_ids, segment_ids, strict=True)):
        batch["token_ids"][row, : len(ids)] = ids
        batch["segment_ids"][row, : len(ids)] = segments
        batch["padding_mask"][row, : len(ids)] = 1
    return batch


def latency_p50_ms(model: OnnxModel, text: str, requests: int = 200) -> float:
    """Median milliseconds of `requests` one-input predictions (`text`, or a [text, text]
    pair where the model takes pairs), one after another, after 5 unmeasured ones."""
    value = text
    if model.task.name == "span_qa" or getattr(model.task.data, "text_pair", None):
        value = [text, text]
    seconds = []
    for _ in range(requests + 5):
        start = time.perf_counter()
        model.predict([value])
        seconds.append(time.perf_counter() - start)
    return round(float(np.median(seconds[5:])) * 1000, 3)
