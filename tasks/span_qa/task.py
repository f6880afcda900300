"""Extractive question answering (SQuAD v1.1 / v2.0): answers are spans of the context.

A question and its context become one model row per doc-stride window,
`[CLS] question [SEP] window [SEP]`, cut by one preprocessor in Python for training
and `predict` and in TensorFlow ops for the SavedModel
(`bertkit_tasks.span_qa.preprocessor.SpanQAPreprocessor`); a Dense(2) head scores every token as the
start and the end of the answer. One decoding rule,
`bertkit_tasks.span_qa.span_decoding.decode_answer_spans` (TensorFlow ops), picks the best
spans over all windows of an example with the max-context rule, in evaluation,
in Python prediction and inside the SavedModel; answers are cut from the
original context by character offsets, never detokenized.

SQuAD v2.0 adds "no answer": the [CLS] position is the null span, and the model
answers "" when `null_score - best_span_score` exceeds `null_score_threshold`.
Unless the recipe sets it, the threshold is tuned on the validation set after
training (the best-F1 threshold of the official script), saved in
`model/task.json` and baked into the SavedModel.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Literal

import numpy as np

from bertkit.errors import UserError
from bertkit.files import input_text
from bertkit.task import Task, head_initializer, string_inputs
from bertkit_tasks.span_qa.preprocessor import SpanQAPreprocessor
from bertkit_tasks.span_qa.squad import QAExample, read_squad

_field = dataclasses.field
_MASKED_LOGIT = -1e9  # added to padding logits: out of every softmax
_DECODE_EXAMPLES = 128  # examples per decode_answer_spans call: bounds its (windows, seq * len)


@dataclasses.dataclass(frozen=True)
class SpanQAOptions:
    version: Literal["1.1", "2.0"] = _field(
        default="1.1",
        metadata={"help": "SQuAD version; '2.0' allows unanswerable questions (quote it in YAML)"},
    )
    max_query_length: int = _field(
        default=64,
        metadata={"min": 1, "help": "question word pieces kept; longer questions are cut"},
    )
    doc_stride: int = _field(
        default=128,
        metadata={
            "min": 1,
            "help": "word pieces between the starts of consecutive context windows",
        },
    )
    n_best_size: int = _field(default=20, metadata={"min": 1, "help": "answer spans decoded"})
    max_answer_length: int = _field(
        default=30, metadata={"min": 1, "help": "longest answer, in word pieces"}
    )
    null_score_threshold: float | None = _field(
        default=None,
        metadata={
            "help": "v2.0: answer '' when null score - best span score exceeds it; null: tuned on "
            "the validation set after training (0.0 without one)"
        },
    )
    return_n_best: bool = _field(
        default=False, metadata={"help": "add the n best spans to every prediction"}
    )
    metric: Literal["auto", "squad", "cmrc2018"] = _field(
        default="auto",
        metadata={
            "help": "EM and F1 of the official SQuAD scripts or of CMRC 2018's (Chinese: one "
            "token a character); auto: cmrc2018 when over 30% of the evaluation contexts' "
            "non-space characters are CJK, else squad"
        },
    )


@dataclasses.dataclass(frozen=True)
class Question(QAExample):
    """A question to answer at prediction time; `n_best` asks for that many of the best
    spans too (0: none)."""

    n_best: int = 0


def requested_spans(value, n_best_size: int) -> int:
    """How many best spans an input's `"n_best"` asks for: `true` all `n_best_size` the
    model decodes, `false` or null none, else a whole number from 1 to `n_best_size`
    (more cannot be answered: the model decodes `n_best_size` spans).

    Example:
        >>> requested_spans(True, 20), requested_spans(3, 20), requested_spans(None, 20)
        (20, 3, 0)
        >>> requested_spans("3", 20)
        Traceback (most recent call last):
        bertkit.errors.UserError: 'n_best' must be true, false or a whole number from 1 to 20 \
(the model's task.n_best_size), got '3'
    """
    if value is None or isinstance(value, bool):  # true is the documented switch, not 1
        return n_best_size if value else 0
    if isinstance(value, int) and 1 <= value <= n_best_size:
        return value
    raise UserError(
        f"'n_best' must be true, false or a whole number from 1 to {n_best_size} "
        f"(the model's task.n_best_size), got {value!r:.40}"
    )


def _question_id(value) -> str:
    """An input's `"id"`: a text or a whole number (not an object, a list, true...)."""
    if isinstance(value, str) or isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise UserError(f"'id' must be a text or a whole number, got {value!r:.40}")


class SpanQATask(Task):
    """Answers a question with a span of its context (SQuAD v1.1 and v2.0).

    Inputs are `{"question": str, "context": str}` dicts (add `"n_best": true` for
    the n best spans, `"n_best": 3` for the 3 best) or `[question, context]` pairs.
    Predictions are `{"answer": str, "start": int, "end": int, "score": float}`: the answer is
    `context[start:end]` (character offsets) and the score its start + end
    logit. "No answer" (v2.0, or a context without tokens) is `""` with start and
    end -1 and the null ([CLS]) score. v2.0 predictions add `null_score_diff`
    (null score - best span score) and `best_span`, the best non-empty answer
    whatever the threshold; `n_best` is a list of `{"answer", "start", "end",
    "score"}`, best first. Metrics are the official SQuAD exact match and F1, or CMRC
    2018's (`task.metric`; for v2.0 also HasAns/NoAns and the best no-answer threshold),
    with `metric` naming the one used.

    The SavedModel takes `question` and `context` string tensors and returns
    `answer`, `start`, `end`, `score` (and `null_score_diff` for v2.0) as above.
    """

    name = "span_qa"
    description = "Extractive question answering, SQuAD v1.1/v2.0 (exact match, F1)."
    Options = SpanQAOptions
    monitor = "f1"
    int8_max_drop = 1.0  # SQuAD F1 is a percentage already
    monitor_points = 1.0
    sequence_outputs = ("logits",)

    # ---- data
    def read(self, path):
        examples, placement = read_squad(path)
        if placement:
            print(f"{path}: {placement}", file=sys.stderr)
        if self.options.version == "1.1":
            for example in examples:
                if example.is_impossible:
                    raise UserError(
                        f"question {example.id!r} has no answer, which SQuAD v1.1 "
                        "does not allow; set task.version: '2.0'",
                        source=path,
                    )
        return examples

    @property
    def null_score_threshold(self) -> float:
        """The recipe's threshold, else the one tuned after training, else 0.0."""
        if self.options.null_score_threshold is not None:
            return self.options.null_score_threshold
        return self.state.get("null_score_threshold", 0.0)

    def preprocessor(self) -> SpanQAPreprocessor:
        """Made when asked for, so that a question too long for the rows is an error when
        rows are made (`featurize`, export), not when a recipe's data is read."""
        return SpanQAPreprocessor(
            self.tokenizer,
            self.sequence_length,
            self.options.max_query_length,
            self.options.doc_stride,
        )

    def featurize(self, examples, training):
        """One row per window; targets are the answer's tokens in it, else [CLS] (0)."""
        return self.preprocessor().featurize(examples, training)

    def make_batch(self, batch, training, rng):
        inputs = {key: batch[key] for key in ("token_ids", "segment_ids", "padding_mask")}
        targets = np.stack([batch["start_positions"], batch["end_positions"]], axis=1)  # (b, 2)
        return inputs, targets, None

    # ---- model
    def build_model(self, backbone):
        import keras
        from keras import ops

        sequence = backbone.output["sequence_output"]  # (batch, seq, hidden)
        logits = keras.layers.Dense(2, name="span_logits", kernel_initializer=head_initializer())(
            sequence
        )
        padding = ops.cast(ops.expand_dims(backbone.input["padding_mask"], -1), "float32")
        logits = ops.cast(logits, "float32") + (1.0 - padding) * _MASKED_LOGIT  # (b, seq, 2)
        return keras.Model(backbone.input, logits, name="bert_span_qa")

    def loss(self):
        return span_loss

    # ---- outputs
    def decode(self, examples, features, outputs):
        from bertkit_tasks.span_qa.span_decoding import decode_answer_rows

        logits, extras = outputs["logits"], features.extras
        splits = np.searchsorted(features.example_index, np.arange(len(examples) + 1))
        predictions = []
        for first in range(0, len(examples), _DECODE_EXAMPLES):
            last = min(first + _DECODE_EXAMPLES, len(examples))
            rows = np.arange(splits[first], splits[last])
            spans = decode_answer_rows(
                [logits[row][:, 0] for row in rows],
                [logits[row][:, 1] for row in rows],
                features.example_index[rows] - first,
                [extras["starts_ok"][row] for row in rows],
                [extras["ends_ok"][row] for row in rows],
                self.options.max_answer_length,
                self.options.n_best_size,
                self.tokenizer.traced_calls,
            )
            predictions += [
                self._prediction(examples[i], extras, rows, spans, i - first)
                for i in range(first, last)
            ]
        return predictions

    def _prediction(self, example, extras, rows, spans, i) -> dict:
        from bertkit_tasks.span_qa.span_decoding import answer_char_span

        n_best = []
        for window, start, end, score in zip(
            spans["window_index"][i],
            spans["start_index"][i],
            spans["end_index"][i],
            spans["span_score"][i],
            strict=True,
        ):
            if window < 0:
                break  # fewer valid spans than n_best_size
            row = rows[window]
            start_char, end_char = answer_char_span(
                extras["char_starts"][row], extras["char_ends"][row], start, end
            )
            n_best.append(
                {
                    "answer": example.context[start_char:end_char],
                    "start": start_char,
                    "end": end_char,
                    "score": float(score),
                }
            )
        v2, null_score_diff = self.options.version == "2.0", spans["null_score_diff"][i]
        # float32 comparison, as in the SavedModel
        answered = bool(n_best) and not (
            v2 and null_score_diff > np.float32(self.null_score_threshold)
        )
        prediction = (
            dict(n_best[0])
            if answered
            else {"answer": "", "start": -1, "end": -1, "score": float(spans["null_score"][i])}
        )
        if v2:
            prediction["null_score_diff"] = float(null_score_diff)
            prediction["best_span"] = n_best[0]["answer"] if n_best else ""
        wanted = getattr(example, "n_best", 0)  # a Question's; all with return_n_best
        if wanted or self.options.return_n_best:
            prediction["n_best"] = n_best[: wanted or None]
        return prediction

    def scoring_metric(self, examples) -> str:
        """`task.metric`, `auto` resolved on the contexts of `examples`; the choice is said
        in one line on stderr the first time it is made."""
        from bertkit_tasks.span_qa.cmrc_eval import choose_metric

        metric, line = choose_metric(self.options.metric, [e.context for e in examples])
        said = self.__dict__.setdefault("_metric_lines", set())
        if line not in said:
            said.add(line)
            print(line, file=sys.stderr)
        return metric

    def evaluate(self, examples, predictions):
        from bertkit_tasks.span_qa import squad_eval

        answers, metric = _by_id(examples, predictions, "answer"), self.scoring_metric(examples)
        version = self.options.version
        metrics = squad_eval.evaluate(examples, answers, version=version, metric=metric)
        if version == "2.0":  # the best threshold, every question answered by its best span
            best = squad_eval.evaluate(
                examples,
                _by_id(examples, predictions, "best_span"),
                _by_id(examples, predictions, "null_score_diff"),
                metric=metric,
            )
            metrics.update({key: value for key, value in best.items() if key.startswith("best_")})
        return {**metrics, "metric": metric}

    def report(self, examples, predictions, directory):
        from bertkit_tasks.span_qa.report import qa_report

        metrics = self.evaluate(examples, predictions)
        return qa_report(
            examples, predictions, metrics, self.options.version, self.null_score_threshold
        )

    def parse_input(self, value):
        if isinstance(value, (list, tuple)) and len(value) == 2:
            question, context = value
            return Question(
                "", input_text(question, "question"), input_text(context, "context"), (), (), False
            )
        if isinstance(value, dict) and "question" in value and "context" in value:
            return Question(
                _question_id(value.get("id", "")),
                input_text(value["question"], "question"),
                input_text(value["context"], "context"),
                (),
                (),
                False,
                n_best=requested_spans(value.get("n_best"), self.options.n_best_size),
            )
        raise UserError(
            f"expected an object with 'question' and 'context' or a [question, "
            f"context] pair, got {value!r:.80}"
        )

    def calibrate(self, examples, predictions):
        """v2.0 without a recipe threshold: the best-F1 no-answer threshold on validation."""
        from bertkit_tasks.span_qa.span_decoding import tuned_null_threshold

        if self.options.version != "2.0" or self.options.null_score_threshold is not None:
            return None
        scores = self.evaluate(examples, predictions)
        unanswered = sum(not example.answers for example in examples)
        return {
            "null_score_threshold": tuned_null_threshold(
                scores["best_f1_thresh"],
                [p["null_score_diff"] for p in predictions],
                answer_none=scores["best_f1"] <= 100.0 * unanswered / len(examples),
            )
        }

    def write_predictions(self, examples, predictions, directory):
        """`predictions.json`, `{id: answer}` as the official scripts read it; v2.0 adds
        `null_odds.json` (`{id: null_score_diff}`) for their `--na-prob-file`."""
        from pathlib import Path

        from bertkit_tasks.span_qa import squad_eval

        squad_eval.write_predictions(
            Path(directory) / "predictions.json", _by_id(examples, predictions, "answer")
        )
        if self.options.version == "2.0":
            squad_eval.write_predictions(
                Path(directory) / "null_odds.json", _by_id(examples, predictions, "null_score_diff")
            )

    # ---- export
    def serving_inputs(self):
        return string_inputs("question", "context")

    def serve(self, model, inputs):
        """featurize + model + decode in TensorFlow ops, windows included."""
        import tensorflow as tf

        from bertkit_tasks.span_qa.preprocessor import graph_answer_text
        from bertkit_tasks.span_qa.span_decoding import decode_answer_spans

        contexts = inputs["context"]
        windows = self.preprocessor().serve(inputs)  # ragged rows, (windows, (tokens))
        token_ids = windows["token_ids"]
        logits = tf.cast(
            model(
                {
                    "token_ids": token_ids.to_tensor(),
                    "segment_ids": windows["segment_ids"].to_tensor(),
                    "padding_mask": tf.ones_like(token_ids).to_tensor(),
                },
                training=False,
            ),
            tf.float32,
        )  # (windows, seq, 2)

        # ---- decoding: the rule of `decode`, with candidate masks laid out like token_ids
        spans = decode_answer_spans(
            logits[:, :, 0],
            logits[:, :, 1],
            tf.cast(windows["example_index"], tf.int32),
            windows["starts_ok"].to_tensor(),
            windows["ends_ok"].to_tensor(),
            self.options.max_answer_length,
            n_best_size=1,
        )

        # ---- the best span's text and character offsets, cut from the context's bytes
        window = tf.maximum(spans["window_index"][:, 0], 0)  # (examples,)
        answered = spans["window_index"][:, 0] >= 0
        if self.options.version == "2.0":
            answered &= spans["null_score_diff"] <= self.null_score_threshold
        answer, start, end = graph_answer_text(
            contexts,
            windows["byte_starts"],
            windows["byte_ends"],
            windows,
            window,
            spans["start_index"][:, 0],
            spans["end_index"][:, 0],
            answered,
        )
        outputs = {
            "answer": answer,
            "start": tf.where(answered, start, -1),
            "end": tf.where(answered, end, -1),
            "score": tf.where(answered, spans["span_score"][:, 0], spans["null_score"]),
        }
        if self.options.version == "2.0":
            outputs["null_score_diff"] = spans["null_score_diff"]
        return outputs

    def transformers_head(self):
        """`BertForQuestionAnswering`: the same Dense(2) start and end logits per token."""
        from bertkit.serving.transformers_export import TransformersHead

        options = self.options
        lost = [
            f"windows every {options.doc_stride} word pieces over contexts longer than one "
            "(bertkit's doc_stride is the step between windows, transformers' their overlap)"
        ]
        settings = {
            "version": options.version,
            "doc_stride": options.doc_stride,
            "max_query_length": options.max_query_length,
            "max_answer_length": options.max_answer_length,
        }
        if options.version == "2.0":
            settings["null_score_threshold"] = self.null_score_threshold
            lost.insert(
                0,
                f"the tuned no-answer threshold {self.null_score_threshold:.4g} (answer '' when "
                "null score - best span score exceeds it; transformers' "
                "handle_impossible_answer compares at 0)",
            )
        call = {"max_answer_len": options.max_answer_length, "max_seq_len": self.sequence_length}
        call["max_question_len"] = options.max_query_length
        if options.version == "2.0":
            call["handle_impossible_answer"] = True
        return TransformersHead(
            architecture="BertForQuestionAnswering",
            layer="span_logits",
            module="qa_outputs",
            labels=("start", "end"),
            pipeline="question-answering",
            call_options=call,
            settings=settings,
            not_represented=tuple(lost),
            use_note=(
                "transformers 5 has no question-answering pipeline: load "
                "`AutoModelForQuestionAnswering` and decode the start and end logits as its "
                "`run_qa.py` example does (best start <= end within the context)."
            ),
        )


def span_loss(targets, logits):
    """Mean of the start and end cross-entropies; targets (batch, 2), logits (batch, seq, 2)."""
    from keras import ops

    per_side = ops.sparse_categorical_crossentropy(  # (batch, 2)
        ops.cast(targets, "int32"), ops.transpose(logits, (0, 2, 1)), from_logits=True
    )
    return ops.mean(per_side, axis=-1)


def _by_id(examples, predictions, key: str) -> dict:
    return {e.id: p[key] for e, p in zip(examples, predictions, strict=True)}
