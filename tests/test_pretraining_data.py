"""Reading a pretraining corpus and cutting it into MLM/NSP instances."""

import math

import numpy as np
import pytest

from bertkit.errors import UserError
from bertkit_tasks.mlm.pretraining_corpus import create_instances, read_corpus, truncate_pair

# --- read_corpus -----------------------------------------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_text_format_splits_documents_on_blank_lines(tmp_path):
    text = "\n  \nFirst one.\r\n  Second one.  \n\n\n \t\nOther doc.\nLast line without newline"
    assert read_corpus(write(tmp_path, "c.txt", text)) == [
        ["First one.", "Second one."],
        ["Other doc.", "Last line without newline"],
    ]


def test_jsonl_format_one_document_per_line_one_sentence_per_text_line(tmp_path):
    lines = [
        '{"text": "First one.\\n\\n  Second one.\\n", "id": 7}',
        "",
        '{"text": "   "}',
        '{"text": "Other doc."}',
    ]
    path = write(tmp_path, "c.jsonl", "\n".join(lines) + "\n")
    assert read_corpus(path, format="jsonl") == [["First one.", "Second one."], ["Other doc."]]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"text": oops}', "3: invalid JSON: Expecting value"),
        ('{"body": "x", "id": 1}', "3: missing key 'text' (found: 'body', 'id')"),
        ('{"text": 42}', "3: text: expected a string, got 42"),
        ('["text"]', "3: expected an object with a \"text\" key, got ['text']"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "c.jsonl", '{"text": "a"}\n\n' + line + "\n")
    with pytest.raises(UserError) as caught:
        read_corpus(path, format="jsonl")
    assert str(caught.value) == f"{path}:{message}"


def test_missing_file_is_a_user_error(tmp_path):
    path = tmp_path / "absent.txt"
    with pytest.raises(UserError) as caught:
        read_corpus(path)
    assert str(caught.value) == f"{path}: file not found"


def test_non_utf8_line_is_a_user_error(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(UserError) as caught:
        read_corpus(path)
    assert str(caught.value) == f"{path}:2: not UTF-8 text (byte 5)"


def test_unknown_format_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as caught:
        read_corpus(write(tmp_path, "c.csv", "a\n"), format="csv")
    assert str(caught.value) == "unknown corpus format 'csv'; expected one of: text, jsonl"


# --- create_instances ------------------------------------------------------------------------


def labelled_corpus(num_documents, sentences_per_document, sentence_length):
    """Documents whose every token id says where it comes from: `where[id] = (doc, sentence)`."""
    documents, where = [], {}
    for doc in range(num_documents):
        documents.append([])
        for sentence in range(sentences_per_document):
            start = len(where)
            documents[-1].append(list(range(start, start + sentence_length)))
            where.update({token: (doc, sentence) for token in documents[-1][-1]})
    return documents, where


def random_corpus(rng, num_documents=60):
    """Documents of 1-12 sentences of 1-40 tokens; ids are consecutive within a document."""
    documents, next_id = [], 0
    for _ in range(num_documents):
        documents.append([])
        for length in rng.integers(1, 41, size=rng.integers(1, 13)):
            documents[-1].append(list(range(next_id, next_id + length)))
            next_id += int(length)
        next_id += 1000  # a gap: runs never cross documents
    return documents


def is_run(tokens):
    return len(tokens) > 0 and tokens == list(range(tokens[0], tokens[0] + len(tokens)))


@pytest.mark.parametrize("max_sequence_length", [5, 16, 64])
def test_pairs_fit_and_are_contiguous_runs_of_documents(max_sequence_length):
    rng = np.random.default_rng(1)
    instances = create_instances(random_corpus(rng), max_sequence_length, 0.1, rng=rng)
    for instance in instances:
        a, b = instance.segment_a, instance.segment_b
        assert len(a) + len(b) <= max_sequence_length - 3
        assert is_run(a) and is_run(b)
        if not instance.is_random_next:
            assert a[-1] < b[0] < a[-1] + 1000  # B follows A in the same document


@pytest.mark.parametrize("max_sequence_length", [4, 16, 64])
def test_without_nsp_one_segment_within_the_maximum(max_sequence_length):
    rng = np.random.default_rng(2)
    instances = create_instances(random_corpus(rng), max_sequence_length, 0.1, False, rng=rng)
    for instance in instances:
        assert 1 <= len(instance.segment_a) <= max_sequence_length - 2
        assert is_run(instance.segment_a)
        assert instance.segment_b == [] and not instance.is_random_next


def test_next_sentence_is_random_half_the_time_and_from_another_document():
    # Sentences of 4 tokens and room for 16: chunks of 4 sentences, nothing truncated.
    documents, where = labelled_corpus(
        num_documents=2000, sentences_per_document=15, sentence_length=4
    )
    instances = create_instances(documents, 19, short_seq_prob=0.0, rng=np.random.default_rng(3))
    free, random_among_free, covered = 0, 0, []
    for instance in instances:
        a_sentences = sorted({where[token] for token in instance.segment_a})
        b_sentences = sorted({where[token] for token in instance.segment_b})
        covered += a_sentences
        if instance.is_random_next:
            assert b_sentences[0][0] != a_sentences[0][0]
        else:
            assert b_sentences[0] == (a_sentences[-1][0], a_sentences[-1][1] + 1)
            covered += b_sentences
        # A chunk that is one document-final sentence always gets a random next.
        if a_sentences[-1][1] != 14:
            free += 1
            random_among_free += instance.is_random_next
    # Sentences not used by A before a random next are put back: all used exactly once.
    assert sorted(covered) == [(doc, s) for doc in range(2000) for s in range(15)]
    assert abs(random_among_free / free - 0.5) <= 5 * math.sqrt(0.25 / free)


def test_short_seq_prob_shortens_the_target_of_that_share_of_documents():
    # One-token sentences and no NSP: every instance but a document's last has the target length.
    documents = [[[1000 * doc + i] for i in range(100)] for doc in range(1000)]
    for short_seq_prob in (0.0, 0.3):
        instances = create_instances(
            documents, 34, short_seq_prob, False, rng=np.random.default_rng(4)
        )
        firsts = [len(i.segment_a) for i in instances if i.segment_a[0] % 1000 == 0]
        short = sum(length < 32 for length in firsts) / len(firsts)
        expected = short_seq_prob * 30 / 31  # a target drawn from [2, 32] is 32 once in 31
        assert abs(short - expected) <= 5 * math.sqrt(expected * (1 - expected) / len(firsts))
        assert min(firsts) >= 2


def test_same_seed_same_instances_and_empty_input_is_skipped():
    documents = [[[1, 2], [], [3]], [], [[4, 5, 6]], [[]]]
    first = create_instances(documents, 8, rng=np.random.default_rng(5))
    assert first == create_instances(documents, 8, rng=np.random.default_rng(5))
    assert all(instance.segment_a and instance.segment_b for instance in first)


def test_nsp_needs_two_documents_and_room_for_two_tokens():
    with pytest.raises(UserError, match="needs at least 2 non-empty documents, got 1"):
        create_instances([[[1, 2], [3]], [[]]], 16, rng=np.random.default_rng(0))
    assert create_instances([[[1, 2], [3]]], 16, 0.0, False, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="leaves room for < 2 tokens"):
        create_instances([[[1]], [[2]]], 4, rng=np.random.default_rng(0))


# --- truncate_pair ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "len_a, len_b, max_tokens, kept",
    [
        (10, 3, 6, (3, 3)),
        (3, 10, 6, (3, 3)),
        (5, 5, 7, (4, 3)),
        (9, 0, 4, (4, 0)),
        (2, 2, 9, (2, 2)),
    ],
)
def test_truncate_pair_shortens_the_longer_segment_b_on_ties(len_a, len_b, max_tokens, kept):
    a, b = truncate_pair(
        list(range(len_a)), list(range(100, 100 + len_b)), max_tokens, np.random.default_rng(0)
    )
    assert (len(a), len(b)) == kept
    assert a == [] or (is_run(a) and a[-1] < len_a)
    assert b == [] or (is_run(b) and b[-1] < 100 + len_b)


def test_truncate_pair_takes_from_both_ends_evenly():
    rng = np.random.default_rng(6)
    starts = [truncate_pair(list(range(20)), [], 10, rng)[0][0] for _ in range(2000)]
    # Ten removals, each from the front with chance 1/2: the start is Binomial(10, 1/2).
    assert abs(np.mean(starts) - 5) <= 5 * math.sqrt(2.5 / 2000)
    assert min(starts) <= 1 and max(starts) >= 9
