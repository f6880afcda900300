"""A pretraining corpus: reading documents, and cutting them into MLM/NSP instances.

Pure Python and NumPy (no TensorFlow), so it runs under any Keras backend.
Tokenization happens in between: `read_corpus` gives sentences as strings, the
task plugin turns each sentence into WordPiece ids, and `create_instances` cuts
those documents into segment pairs following Google BERT's
`create_pretraining_data.py`. The plugin then packs each instance as
`[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]` without next-sentence prediction)
and masks every batch with `bertkit_tasks.mlm.masking.mask_tokens`.
"""

from __future__ import annotations

import dataclasses
import reprlib

import numpy as np

from bertkit.errors import UserError
from bertkit.files import kind_from_name, numbered_lines, parse_json

CORPUS_FORMATS = ("text", "jsonl")


def read_corpus(path, format: str = "text") -> list[list[str]]:
    """Reads a pretraining corpus as a list of documents, each a list of sentences.

    Formats:
        "text": Google BERT's format. One sentence per line; a blank line
            ends a document.
        "jsonl": one JSON object per line, `{"text": "..."}`, each one
            document. No sentence splitter is applied: every non-empty line of
            the text is one sentence, so write one sentence per line (a whole
            paragraph on one line becomes one long "sentence"). Other keys are
            ignored; blank lines of the file are skipped.

    Sentences are stripped of surrounding whitespace; documents without any
    sentence are dropped. The file must be UTF-8.

    Args:
        path: the corpus file.
        format: "text" or "jsonl".

    Returns:
        The documents, each a non-empty list of non-empty sentences.

    Raises:
        UserError: unknown format, unreadable or non-UTF-8 file, or (jsonl) a
            line that is not a JSON object with a string "text"; the message
            names the file and line.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
        >>> _ = path.write_text("The cat sat.\\nIt purred.\\n\\n\\nA new document.\\n")
        >>> read_corpus(path)
        [['The cat sat.', 'It purred.'], ['A new document.']]
    """
    if format not in CORPUS_FORMATS:
        raise UserError(f"unknown corpus format {format!r}; expected one of: text, jsonl")
    lines = numbered_lines(path)
    if format == "text":
        return _text_documents(lines)
    return _jsonl_documents(lines, path)


def _text_documents(lines) -> list[list[str]]:
    documents = [[]]
    for _, line in lines:
        sentence = line.strip()
        if sentence:
            documents[-1].append(sentence)
        elif documents[-1]:
            documents.append([])
    return [document for document in documents if document]


def _jsonl_documents(lines, path) -> list[list[str]]:
    documents = []
    for number, line in lines:
        if line.strip():
            text = _jsonl_text(line, path, number)
            sentences = [sentence.strip() for sentence in text.splitlines() if sentence.strip()]
            if sentences:
                documents.append(sentences)
    return documents


def _jsonl_text(line: str, path, number: int) -> str:
    record = parse_json(line, path, number)
    if not isinstance(record, dict):
        message = f'expected an object with a "text" key, got {reprlib.repr(record)}'
        raise UserError(message, source=path, line=number)
    if "text" not in record:
        found = ", ".join(repr(key) for key in record) or "none"
        raise UserError(f"missing key 'text' (found: {found})", source=path, line=number)
    if not isinstance(record["text"], str):
        message = f"expected a string, got {reprlib.repr(record['text'])}"
        raise UserError(message, source=path, line=number, key="text")
    return record["text"]


@dataclasses.dataclass(frozen=True)
class Instance:
    """One pretraining example before packing into `[CLS] A [SEP] B [SEP]`.

    Attributes:
        segment_a: token ids of the first segment; never empty.
        segment_b: token ids of the second segment; never empty with
            next-sentence prediction, always empty without.
        is_random_next: True when B comes from another document (BERT's
            next-sentence label 1), False when B really follows A.
    """

    segment_a: list[int]
    segment_b: list[int]
    is_random_next: bool


def create_instances(
    documents: list[list[list[int]]],
    max_sequence_length: int,
    short_seq_prob: float = 0.1,
    next_sentence_prediction: bool = True,
    *,
    rng: np.random.Generator,
) -> list[Instance]:
    """Cuts tokenized documents into pretraining instances, as Google BERT does.

    For each document, a target length is drawn once: the most tokens that fit
    (`max_sequence_length` - 3 for `[CLS] A [SEP] B [SEP]`, - 2 without
    next-sentence prediction) or, with probability `short_seq_prob`, a random
    length in [2, most], so the model also sees short inputs. Sentences are
    accumulated into a chunk until it reaches the target (or the document
    ends), and the chunk becomes one instance:

    * With next-sentence prediction, A takes a random number of the chunk's
      first sentences. B is the rest of the chunk half of the time; otherwise
      (always, for a one-sentence chunk) B is read from a random position of
      another document, up to the target length, and the chunk's sentences not
      used in A go back to the document for the next instance. Unlike BERT,
      which retries 10 random draws, the other document is drawn uniformly
      among the *other* documents, so B is never from A's own document.
    * Without it, the whole chunk is A and B is empty.

    The pair is then cut to the most tokens with `truncate_pair`. Empty
    sentences and documents are ignored. The instances are returned shuffled,
    as in BERT: those of one document would otherwise sit next to each other.

    Args:
        documents: documents, each a list of sentences, each a list of token ids.
        max_sequence_length: the packed length, special tokens included.
        short_seq_prob: the probability of a short target length per document.
        next_sentence_prediction: whether to build A/B pairs with NSP labels.
        rng: the random generator; the same seed gives the same instances.

    Returns:
        The instances, in random order.

    Raises:
        ValueError: `max_sequence_length` leaves room for fewer than 2 tokens.
        UserError: next-sentence prediction with fewer than 2 non-empty documents.

    Example:
        >>> documents = [[[1, 2], [3, 4], [5]], [[6, 7, 8], [9]]]
        >>> rng = np.random.default_rng(0)
        >>> instances = create_instances(documents, max_sequence_length=8, rng=rng)
        >>> all(len(i.segment_a) + len(i.segment_b) <= 8 - 3 for i in instances)
        True
        >>> instances = create_instances(documents, max_sequence_length=6, short_seq_prob=0.0,
        ...                              next_sentence_prediction=False, rng=rng)
        >>> sorted(instance.segment_a for instance in instances)
        [[1, 2, 3, 4], [5], [6, 7, 8, 9]]
    """
    max_tokens = max_sequence_length - (3 if next_sentence_prediction else 2)
    if max_tokens < 2:
        raise ValueError(f"max_sequence_length {max_sequence_length} leaves room for < 2 tokens")
    documents = [[sentence for sentence in document if len(sentence)] for document in documents]
    documents = [document for document in documents if document]
    if next_sentence_prediction and len(documents) < 2:
        raise UserError(
            f"next-sentence prediction needs at least 2 non-empty documents, got {len(documents)}"
        )
    instances = []
    for index in range(len(documents)):
        target_length = max_tokens
        if rng.random() < short_seq_prob:
            target_length = int(rng.integers(2, max_tokens + 1))
        instances += _document_instances(
            documents, index, target_length, max_tokens, next_sentence_prediction, rng
        )
    rng.shuffle(instances)
    return instances


def _document_instances(documents, index, target_length, max_tokens, pairs, rng):
    """The instances of `documents[index]`, one per chunk of about `target_length` tokens."""
    document, instances = documents[index], []
    chunk, chunk_length, position = [], 0, 0
    while position < len(document):
        chunk.append(document[position])
        chunk_length += len(document[position])
        position += 1
        if position < len(document) and chunk_length < target_length:
            continue
        if pairs:
            segment_a, segment_b, is_random_next, unused = _pair(
                chunk, documents, index, target_length, rng
            )
            position -= unused  # put back: the next chunk starts with them
        else:
            segment_a, segment_b, is_random_next = _concatenated(chunk), [], False
        segment_a, segment_b = truncate_pair(segment_a, segment_b, max_tokens, rng)
        instances.append(Instance(segment_a, segment_b, is_random_next))
        chunk, chunk_length = [], 0
    return instances


def _pair(chunk, documents, index, target_length, rng):
    """Untruncated `(A, B, is_random_next, number of chunk sentences left unused)`."""
    a_end = int(rng.integers(1, len(chunk))) if len(chunk) > 1 else 1
    segment_a = _concatenated(chunk[:a_end])
    if len(chunk) > 1 and rng.random() >= 0.5:
        return segment_a, _concatenated(chunk[a_end:]), False, 0
    segment_b = _random_continuation(documents, index, target_length - len(segment_a), rng)
    return segment_a, segment_b, True, len(chunk) - a_end


def _random_continuation(documents, index, target_length, rng) -> list[int]:
    """Sentences from a random point of a random document other than `index`."""
    other = int(rng.integers(len(documents) - 1))
    if other >= index:
        other += 1  # skips documents[index]
    document = documents[other]
    segment = []
    for sentence in document[int(rng.integers(len(document))) :]:
        segment += sentence
        if len(segment) >= target_length:
            break
    return segment


def _concatenated(sentences) -> list[int]:
    return [token for sentence in sentences for token in sentence]


def truncate_pair(segment_a, segment_b, max_tokens: int, rng: np.random.Generator):
    """Shortens a segment pair to at most `max_tokens` tokens, as BERT's `truncate_seq_pair`.

    Tokens come off the longer segment one at a time (B on a tie), each from
    its front or its back with equal chance, so neither end is favoured.
    Computed in closed form: the counts per segment are fixed by the lengths,
    and the number taken from the front is binomial.

    Args:
        segment_a: token ids of A.
        segment_b: token ids of B (may be empty).
        max_tokens: the most tokens A and B may hold together.
        rng: the random generator.

    Returns:
        `(segment_a, segment_b)`, each a contiguous slice of its input.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> a, b = truncate_pair(list(range(10)), [20, 21, 22], max_tokens=6, rng=rng)
        >>> len(a), b
        (3, [20, 21, 22])
    """
    excess = max(0, len(segment_a) + len(segment_b) - max_tokens)
    gap = min(excess, abs(len(segment_a) - len(segment_b)))
    # The longer one shrinks to the other's length, then they take turns (B first).
    from_a = (gap if len(segment_a) > len(segment_b) else 0) + (excess - gap) // 2
    return _trimmed(segment_a, from_a, rng), _trimmed(segment_b, excess - from_a, rng)


def _trimmed(segment, count: int, rng):
    from_front = int(rng.binomial(count, 0.5)) if count else 0
    return segment[from_front : len(segment) - (count - from_front)]


def pack_instance(instance, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`[CLS] A [SEP] B [SEP]` (`[CLS] A [SEP]` without B): int32 token and segment ids.

    Example:
        >>> [a.tolist() for a in pack_instance(Instance([7, 8], [9], True), 2, 3)]
        [[2, 7, 8, 3, 9, 3], [0, 0, 0, 0, 1, 1]]
    """
    second = [*instance.segment_b, sep_id] if instance.segment_b else []
    token_ids = [cls_id, *instance.segment_a, sep_id, *second]
    return (
        np.array(token_ids, np.int32),
        np.array([0] * (len(token_ids) - len(second)) + [1] * len(second), np.int32),
    )


def corpus_format(path, format: str) -> str:
    """The corpus format of a file: `format` unless "auto", then by the file name.

    Example:
        >>> corpus_format("wiki.jsonl", "auto"), corpus_format("wiki.txt", "auto")
        ('jsonl', 'text')
    """
    if format != "auto":
        return format
    return "jsonl" if kind_from_name(path) in ("jsonl", "json") else "text"
