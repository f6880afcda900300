"""Entity-level evaluation with the semantics of the CoNLL-2000/2003 `conlleval` script.

A chunk (entity) is a run of words with one type. Where chunks start and end is
decided, word by word, from the previous tag and the current tag alone, by the
script's `startOfChunk` / `endOfChunk` rules. Those rules read IOB1, IOB2 and
BIOES alike, and they give ill-formed sequences a meaning: `I-PER` after `O`
starts a chunk, and a change of type ends one chunk and starts another.

E- and S- follow the BIOES edition of `conlleval.pl`, which adds to the original
rules that E- and S- always close a chunk and that B- and S- always open one.
On B-/I-/O tags, so on IOB1 and IOB2, the rules are exactly the original ones.

A type is everything after the first hyphen (`B-ORG-LOC` has type `ORG-LOC`),
as in the 2004 revision of the script. Scores are fractions in [0, 1], not the
percentages the script prints; `format_report` prints those.
"""

from __future__ import annotations

from collections import Counter

OUTSIDE = "O"
_PREFIXES = ("B", "I", "E", "S")


def split_tag(tag: str) -> tuple[str, str]:
    """Splits a tag into its prefix and its type; `O` has the empty type.

    Raises:
        ValueError: `tag` is neither `O` nor one of B-/I-/E-/S- followed by a type.

    Example:
        >>> split_tag("B-ORG-LOC"), split_tag("O")
        (('B', 'ORG-LOC'), ('O', ''))
    """
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, hyphen, type_ = tag.partition("-")
    if prefix not in _PREFIXES or not hyphen or not type_:
        raise ValueError(f"unknown tag {tag!r}: expected 'O' or B-, I-, E-, S- and a type")
    return prefix, type_


def chunk_starts(prev_tag: str, tag: str) -> bool:
    """Whether a chunk starts at the word tagged `tag` (conlleval's `startOfChunk`).

    Use `"O"` as `prev_tag` for the first word of a sentence.

    Example:
        >>> chunk_starts("O", "I-PER"), chunk_starts("B-PER", "I-PER")
        (True, False)
        >>> chunk_starts("I-PER", "I-LOC"), chunk_starts("E-PER", "I-PER")
        (True, True)
    """
    prev_prefix, prev_type = split_tag(prev_tag)
    prefix, type_ = split_tag(tag)
    if prefix == OUTSIDE:
        return False
    return prefix in ("B", "S") or prev_prefix in (OUTSIDE, "E", "S") or prev_type != type_


def chunk_ends(prev_tag: str, tag: str) -> bool:
    """Whether the chunk holding the word tagged `prev_tag` ends before `tag` (`endOfChunk`).

    Use `"O"` as `tag` after the last word of a sentence.

    Example:
        >>> chunk_ends("B-PER", "I-PER"), chunk_ends("I-PER", "O")
        (False, True)
        >>> chunk_ends("I-PER", "I-LOC"), chunk_ends("S-PER", "I-PER")
        (True, True)
    """
    prev_prefix, prev_type = split_tag(prev_tag)
    prefix, type_ = split_tag(tag)
    if prev_prefix == OUTSIDE:
        return False
    return prefix in (OUTSIDE, "B", "S") or prev_prefix in ("E", "S") or prev_type != type_


def extract_chunks(tags: list[str]) -> list[tuple[str, int, int]]:
    """The chunks of one sentence as `(type, start, end)`, end exclusive, in order.

    Like conlleval, the sentence is read as if `O` came before and after it.

    Example:
        >>> extract_chunks(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "S-ORG"])
        [('PER', 0, 2), ('LOC', 3, 4), ('LOC', 4, 5), ('ORG', 5, 6)]
    """
    chunks, open_start, prev_tag = [], None, OUTSIDE
    for position, tag in enumerate([*tags, OUTSIDE]):
        if open_start is not None and chunk_ends(prev_tag, tag):
            chunks.append((split_tag(prev_tag)[1], open_start, position))
            open_start = None
        if chunk_starts(prev_tag, tag):
            open_start = position
        prev_tag = tag
    return chunks


def evaluate(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Precision, recall and F1 over chunks, overall and per type, as conlleval counts them.

    A predicted chunk is correct when a gold chunk has the same start, end and
    type. conlleval finds these by walking both sequences in step; with its
    start/end rules that walk counts exactly the chunks the two sides share,
    which is how they are counted here (the tests check both agree).

    Args:
        gold: one list of tags per sentence.
        predicted: as many sentences as `gold`, each as long as its gold one.

    Returns:
        `precision`, `recall`, `f1` (fractions; 0.0 where undefined), `accuracy`
        (fraction of words whose tag is exactly right), the counts `found_gold`,
        `found_predicted`, `correct`, `tokens`, and `per_type`: for each type,
        sorted, `{precision, recall, f1, support, found_predicted, correct}`
        where `support` is the number of gold chunks of that type.

    Raises:
        ValueError: the sentences do not line up, or a tag is malformed.

    Example:
        >>> result = evaluate([["B-PER", "I-PER", "O", "B-LOC"]],
        ...                   [["B-PER", "I-PER", "O", "B-ORG"]])
        >>> result["precision"], result["recall"], result["f1"], result["accuracy"]
        (0.5, 0.5, 0.5, 0.75)
        >>> result["per_type"]["PER"]["f1"], result["per_type"]["LOC"]["support"]
        (1.0, 1)
    """
    _check_aligned(gold, predicted)
    tokens = sum(len(sentence) for sentence in gold)
    right_tags = sum(
        g == p for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True)
    )
    result = chunk_scores(_all_chunks(gold), _all_chunks(predicted))
    result.update(accuracy=right_tags / tokens if tokens else 0.0, tokens=tokens)
    return result


def chunk_scores(gold_chunks: set, predicted_chunks: set) -> dict:
    """`precision`, `recall`, `f1`, `found_gold`, `found_predicted`, `correct` and
    `per_type` (as `evaluate` gives them) of chunks `(sentence, type, start, end)`.

    Example:
        >>> scores = chunk_scores({(0, "PER", 0, 2), (1, "LOC", 3, 4)}, {(0, "PER", 0, 2)})
        >>> scores["precision"], scores["recall"], scores["per_type"]["LOC"]["support"]
        (1.0, 0.5, 1)
    """
    correct_chunks = gold_chunks & predicted_chunks
    result = _scores(len(correct_chunks), len(gold_chunks), len(predicted_chunks))
    result.update(
        found_gold=len(gold_chunks),
        found_predicted=len(predicted_chunks),
        correct=len(correct_chunks),
        per_type=_per_type(gold_chunks, predicted_chunks, correct_chunks),
    )
    return result


def format_report(result: dict, unit: str = "tokens") -> str:
    """Formats an `evaluate` result the way conlleval prints it, in percentages.

    Like conlleval, the number after each type's FB1 counts its predicted chunks;
    `unit` names what `tokens` counts (characters, for span data).

    Example:
        >>> print(format_report(evaluate([["B-PER", "O"]], [["B-PER", "B-LOC"]])))
        processed 2 tokens with 1 phrases; found: 2 phrases; correct: 1.
        accuracy:  50.00%; precision:  50.00%; recall: 100.00%; FB1:  66.67
                      LOC: precision:   0.00%; recall:   0.00%; FB1:   0.00  1
                      PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1
    """
    lines = [
        f"processed {result['tokens']} {unit} with {result['found_gold']} phrases; "
        f"found: {result['found_predicted']} phrases; correct: {result['correct']}."
    ]
    if result["tokens"]:  # conlleval prints no scores for empty input
        lines.append(f"accuracy: {100 * result['accuracy']:6.2f}%; " + _score_text(result))
    for type_, scores in result["per_type"].items():
        lines.append(f"{type_:>17}: {_score_text(scores)}  {scores['found_predicted']}")
    return "\n".join(lines)


def _check_aligned(gold: list[list[str]], predicted: list[list[str]]) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for index, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(
                f"sentence {index}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted"
            )


def _all_chunks(sentences: list[list[str]]) -> set[tuple[int, str, int, int]]:
    """Chunks of all sentences as `(sentence, type, start, end)`: a chunk never spans two."""
    return {
        (index, *chunk) for index, tags in enumerate(sentences) for chunk in extract_chunks(tags)
    }


def _scores(correct: int, found_gold: int, found_predicted: int) -> dict:
    precision = correct / found_predicted if found_predicted else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _per_type(gold_chunks: set, predicted_chunks: set, correct_chunks: set) -> dict:
    def count_types(chunks):
        return Counter(type_ for _, type_, _, _ in chunks)

    gold, predicted, correct = map(count_types, (gold_chunks, predicted_chunks, correct_chunks))
    per_type = {}
    for type_ in sorted(gold.keys() | predicted.keys()):
        scores = _scores(correct[type_], gold[type_], predicted[type_])
        scores.update(support=gold[type_], found_predicted=predicted[type_], correct=correct[type_])
        per_type[type_] = scores
    return per_type


def _score_text(scores: dict) -> str:
    return (
        f"precision: {100 * scores['precision']:6.2f}%; "
        f"recall: {100 * scores['recall']:6.2f}%; FB1: {100 * scores['f1']:6.2f}"
    )
