"""Logits -> `bertkit predict`'s JSON in NumPy, for the ONNX runtime (no TensorFlow).

bertkit decodes tagging and span QA with TensorFlow ops (`bertkit_tasks.tagging.decoding`,
`bertkit_tasks.span_qa.span_decoding`), shared by evaluation and the SavedModel; these are the
same rules in NumPy, checked against `predict` by `tests/test_onnx_export.py`:

- tagging: each word's label probabilities, read at its first piece in the window where it
  has the most context; with `decoding: constrained`, the sentence's most probable tag
  sequence among those its scheme allows (`viterbi_tags`, tf-text's
  `viterbi_constrained_sequence` with start and end states, in float32 log space), else each
  word's most probable tag; entities by conlleval's rules (`extract_chunks`), scored by the
  mean probability of their words' tags.
- span QA: rows `[CLS] question [SEP] window [SEP]` over doc-stride windows
  (`question_rows`), and each question's n best spans over all its windows (`best_spans`):
  every (start, end) with the start in its max-context window, `0 <= end - start <
  max_answer_length`, scored `start_logit + end_logit` in float32, ties to the earlier
  window, start, end.

Ties go where bertkit's decoders send them (tf-text's Viterbi: to the highest label id).

Example:
    >>> allowed = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1]], bool)
    >>> probabilities = np.array([[0.6, 0.3, 0.1], [0.3, 0.1, 0.6]])  # O, B-PER, I-PER
    >>> viterbi_tags(probabilities, allowed).tolist()  # O I-PER is not iob2
    [1, 2]
"""

from __future__ import annotations

import numpy as np

from bertkit.windows import max_context_windows, sliding_windows

_TINY = 1e-30  # bertkit_tasks.tagging.decoding's floor under probabilities before their log


def word_probabilities(row_logits: list, read_at: np.ndarray) -> np.ndarray:
    """(words, labels) float64 softmax probabilities of one sentence, each word's read at
    `read_at[word] = (row, position)`."""
    logits = np.array([row_logits[row][position] for row, position in read_at], np.float64)
    logits = logits.reshape(len(read_at), -1)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def viterbi_tags(probabilities: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """Each word's label id: the most probable sequence whose every transition `allowed`
    (`[L + 1, L + 1]`, index L the sentence edge) permits, else (no such sequence, or
    `allowed` None) each word's most probable label."""
    most_probable = probabilities.argmax(axis=1) if len(probabilities) else np.zeros(0, int)
    if allowed is None or not len(probabilities):
        return most_probable
    log_p = np.log(np.maximum(probabilities.astype(np.float32), np.float32(_TINY)))
    edge = len(allowed) - 1
    moves = np.where(allowed[:edge, :edge], np.float32(0), np.float32(-np.inf))  # (L, L)
    score = np.where(allowed[edge, :edge], log_p[0], -np.inf).astype(np.float32)
    back = []
    for word in range(1, len(log_p)):
        candidates = score[:, None] + moves  # (previous, label)
        back.append(_last_argmax(candidates, axis=0))
        score = candidates.max(axis=0) + log_p[word]
    score = np.where(allowed[:edge, edge], score, -np.inf)
    if not np.isfinite(score.max()):
        return most_probable
    path = [int(_last_argmax(score, axis=0))]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return np.array(path[::-1])


def _last_argmax(values: np.ndarray, axis: int) -> np.ndarray:
    """`argmax`, ties to the highest index: tf-text's Viterbi keeps the last best label."""
    return values.shape[axis] - 1 - np.flip(values, axis=axis).argmax(axis=axis)


def tagging_prediction(example, chars, probabilities: np.ndarray, labels: list, allowed) -> dict:
    """One sentence's prediction as `TaggingTask.decode` gives it: `entities` with character
    offsets for a text (`chars`: (2, words)), `tags` and word-index entities for words."""
    from bertkit_tasks.tagging.conlleval import extract_chunks

    tag_ids = viterbi_tags(probabilities, allowed)
    chosen = probabilities[np.arange(len(tag_ids)), tag_ids]  # (words,)
    tags = [labels[i] for i in tag_ids]
    entities = []
    for type_, start, end in extract_chunks(tags):
        entity = {"text": "", "type": type_, "start": start, "end": end}
        entity["score"] = float(chosen[start:end].mean())
        if chars is None:
            entity["text"] = " ".join(example.words[start:end])
        else:
            entity["start"], entity["end"] = int(chars[0][start]), int(chars[1][end - 1])
            entity["text"] = example.text[entity["start"] : entity["end"]]
        entities.append(entity)
    return {"entities": entities} if chars is not None else {"tags": tags, "entities": entities}


def question_rows(question, context, tokenizer, sequence_length: int, doc_stride: int) -> list:
    """One question's rows, as `SpanQAPreprocessor.featurize` makes them for prediction: per
    window, `token_ids` and `segment_ids` (int32), `char_starts` / `char_ends` (each
    position's context characters, -1 outside the context) and `starts_ok` / `ends_ok`
    (where an answer may start: a context token in its max-context window; end: any)."""
    offset = len(question) + 2  # [CLS] question [SEP]
    windows = sliding_windows(len(context.ids), sequence_length - offset - 1, doc_stride)
    owners = max_context_windows(windows, windows[-1][1])
    rows = []
    for index, (first, last) in enumerate(windows):
        ids = np.concatenate(
            [[tokenizer.cls_id], question, [tokenizer.sep_id], context.ids[first:last]]
        )
        ids = np.append(ids, tokenizer.sep_id).astype(np.int32)
        inside = slice(offset, offset + last - first)
        row = {"token_ids": ids, "segment_ids": (np.arange(len(ids)) >= offset).astype(np.int32)}
        for name, values in (("char_starts", context.starts), ("char_ends", context.ends)):
            row[name] = np.full(len(ids), -1, np.int64)
            row[name][inside] = values[first:last]
        row["ends_ok"] = np.zeros(len(ids), bool)
        row["ends_ok"][inside] = True
        row["starts_ok"] = np.zeros(len(ids), bool)
        row["starts_ok"][inside] = np.array(owners[first:last]) == index
        rows.append(row)
    return rows


def best_spans(logits: list, rows: list, max_answer_length: int, n_best_size: int) -> dict:
    """One question's `n_best_size` best spans over its windows: `spans`, a list of (window,
    start, end, score), best first; `null_score`, the least [CLS] score `start[0] + end[0]`
    over its windows; `null_score_diff`, `null_score` minus the best span's score (+inf
    without a span). Scores are float32, as bertkit's decoder computes them."""
    found = []
    for window, (row_logits, row) in enumerate(zip(logits, rows, strict=True)):
        start_logits = row_logits[:, 0].astype(np.float32)
        end_logits = row_logits[:, 1].astype(np.float32)
        starts, ends = np.meshgrid(np.arange(len(row_logits)), np.arange(len(row_logits)))
        starts, ends = starts.T, ends.T  # (start, end)
        valid = (ends >= starts) & (ends - starts < max_answer_length)
        valid &= row["starts_ok"][:, None] & row["ends_ok"][None, :]
        scores = start_logits[:, None] + end_logits[None, :]  # (start, end) float32
        for start, end in zip(*np.nonzero(valid), strict=True):
            found.append((-scores[start, end], window, int(start), int(end)))
    found.sort()
    spans = [(w, s, e, np.float32(-score)) for score, w, s, e in found[:n_best_size]]
    null_score = min(np.float32(r[0, 0]) + np.float32(r[0, 1]) for r in logits)
    best = spans[0][3] if spans else np.float32(-np.inf)
    return {"spans": spans, "null_score": null_score, "null_score_diff": null_score - best}


def span_prediction(example, rows: list, decoded: dict, task) -> dict:
    """The prediction `SpanQATask.decode` gives for one question, from `best_spans`."""
    n_best = []
    for window, start, end, score in decoded["spans"]:
        start_char = int(rows[window]["char_starts"][start])
        end_char = int(rows[window]["char_ends"][end])
        n_best.append(
            {
                "answer": example.context[start_char:end_char],
                "start": start_char,
                "end": end_char,
                "score": float(score),
            }
        )
    v2, null_score_diff = task.options.version == "2.0", decoded["null_score_diff"]
    answered = bool(n_best) and not (v2 and null_score_diff > np.float32(task.null_score_threshold))
    if answered:
        prediction = dict(n_best[0])
    else:
        prediction = {"answer": "", "start": -1, "end": -1, "score": float(decoded["null_score"])}
    if v2:
        prediction["null_score_diff"] = float(null_score_diff)
        prediction["best_span"] = n_best[0]["answer"] if n_best else ""
    wanted = getattr(example, "n_best", 0)
    if wanted or task.options.return_n_best:
        prediction["n_best"] = n_best[: wanted or None]
    return prediction
