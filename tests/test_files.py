"""Tests for bertkit.files, the one reading layer, and the readers that use it."""

import pytest

from bertkit.errors import UserError
from bertkit.files import kind_from_name, numbered_lines, predict_inputs, read_json_lines, read_text
from bertkit.tabular import read_rows
from bertkit_tasks.mlm.pretraining_corpus import read_corpus
from bertkit_tasks.span_qa.squad import read_squad
from bertkit_tasks.tagging.conll import read_conll


def error_of(function, *args):
    with pytest.raises(UserError) as caught:
        list(function(*args))
    return str(caught.value)


def test_a_byte_order_mark_does_not_break_a_tsv_header(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("\ufeffsentence\tlabel\nfine film\t1\n", encoding="utf-8")
    assert list(read_rows(path, "tsv", ["sentence", "label"])) == [
        (2, {"sentence": "fine film", "label": "1"})
    ]


def test_a_byte_order_mark_and_crlf_in_a_csv(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes(b'\xef\xbb\xbftext,label\r\n"a, b",1\r\nc,0\r\n')
    assert list(read_rows(path, "csv", ["text", "label"])) == [
        (2, {"text": "a, b", "label": "1"}),
        (3, {"text": "c", "label": "0"}),
    ]


def test_text_and_lines_drop_the_bom_and_crlf(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\n\nthree")
    assert read_text(path) == "one\ntwo\n\nthree"
    assert list(numbered_lines(path)) == [(1, "one"), (2, "two"), (3, ""), (4, "three")]


def test_every_reader_words_a_missing_file_alike(tmp_path):
    path = tmp_path / "absent.jsonl"
    for reader in (
        read_text,
        read_conll,
        read_squad,
        read_corpus,
        read_json_lines,
        lambda p: read_rows(p, "jsonl", ["text"]),
    ):
        assert error_of(reader, path) == f"{path}: file not found"


def test_every_reader_words_bad_utf8_alike(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"a O\nb\xff O\n")
    for reader in (
        read_text,
        read_conll,
        read_squad,
        read_corpus,
        lambda p: read_rows(p, "tsv", ["a O"]),
    ):
        assert error_of(reader, path) == f"{path}:2: not UTF-8 text (byte 5)"


def test_every_reader_words_bad_json_lines_alike(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    expected = f"{path}:2: invalid JSON: Expecting value"
    for reader in (
        read_squad,
        lambda p: read_corpus(p, "jsonl"),
        read_json_lines,
        lambda p: read_rows(p, "jsonl", ["text"]),
    ):
        assert error_of(reader, path) == expected


def test_a_directory_is_not_a_file(tmp_path):
    assert error_of(read_text, tmp_path) == f"{tmp_path}: is a directory, expected a file"


def test_kinds_by_extension():
    assert [
        kind_from_name(name)
        for name in ("a.jsonl", "a.ndjson", "a.json", "a.CSV", "a.tsv", "a.txt", "a.conll")
    ] == ["jsonl", "jsonl", "json", "csv", "tsv", "text", None]


@pytest.mark.parametrize("fmt, separator", [("csv", ","), ("tsv", "\t")])
def test_a_cell_over_128_kib_names_the_file_line_and_column(tmp_path, fmt, separator):
    path = tmp_path / f"train.{fmt}"
    path.write_text(f"text{separator}label\nfine{separator}1\n{'a' * 200_000}{separator}0\n")
    assert error_of(read_rows, path, fmt, ["text", "label"]) == (
        f"{path}:3: text: a cell of 200,000 characters, over the limit of 131,072 (128 KiB)"
    )
    path.write_text(f"text{separator}label\n{'a' * 131_072}{separator}0\n")
    assert len(next(read_rows(path, fmt, ["text", "label"]))[1]["text"]) == 131_072


def test_predict_inputs_are_json_values_texts_or_none_per_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b'\xef\xbb\xbfa fine film\r\n["p", "h"]\n\n  \n[broken\n' + b"[" * 100_000)
    assert list(predict_inputs(path)) == [
        "a fine film",
        ["p", "h"],
        None,
        None,
        "[broken",
        "[" * 100_000,
    ]
    assert error_of(predict_inputs, tmp_path) == f"{tmp_path}: is a directory, expected a file"


def test_arriving_chunks_hand_on_what_has_come_then_the_error():
    import threading

    from bertkit.files import arriving_chunks

    stalled = threading.Event()

    def slow_source():  # `tail -f`: two lines, a pause, a line, then a read error
        yield from ("one", None)
        stalled.wait(60)
        yield "three"
        raise UserError("not UTF-8 text (byte 9)", source="<stdin>", line=4)

    chunks = arriving_chunks(slow_source(), 16)
    assert next(chunks) == ["one", None]
    stalled.set()
    assert next(chunks) == ["three"]
    with pytest.raises(UserError, match=r"^<stdin>:4: not UTF-8 text \(byte 9\)$"):
        next(chunks)
