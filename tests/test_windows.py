"""Windows: the Python rules, and their TensorFlow mirrors against them."""

import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bertkit.windows import (
    batch_sliding_windows,
    max_context_flags,
    max_context_windows,
    sliding_windows,
    windowed_rows,
    word_windows,
)


def test_word_windows_keep_whole_words():
    offsets = np.array([0, 3, 4, 5, 8])  # words of 3, 1, 1 and 3 pieces
    # piece windows (0, 4), (2, 6), (4, 8): word 0 is cut by the second, word 3 by it too
    assert word_windows(offsets, window_size=4, stride=2) == [(0, 2), (1, 3), (2, 4)]
    assert word_windows(np.array([0]), window_size=4, stride=2) == [(0, 0)]  # no words
    assert word_windows(np.array([0, 2]), window_size=4, stride=2) == [(0, 1)]


def test_graph_windows_match_the_python_rule():
    rng = random.Random(0)
    lengths = [rng.randint(0, 40) for _ in range(40)]
    sizes = [rng.randint(1, 13) for _ in range(40)]
    rows, starts, ends = batch_sliding_windows(
        tf.constant(lengths, tf.int64), tf.constant(sizes, tf.int64), 3
    )
    first_token = np.cumsum([0] + lengths)[rows.numpy()]  # windows over all tokens, flat
    tokens = tf.ragged.range(starts + first_token, ends + first_token)
    flags = max_context_flags(
        tokens, starts + first_token, ends + first_token, tf.constant(sum(lengths), tf.int64)
    )
    windows = list(zip(rows.numpy(), starts.numpy(), ends.numpy(), flags.to_list(), strict=True))
    for row, (length, size) in enumerate(zip(lengths, sizes, strict=True)):
        expected = sliding_windows(length, size, 3)
        owners = max_context_windows(expected, length)
        mine = [w[1:] for w in windows if w[0] == row]
        assert [(s, e) for s, e, _ in mine] == expected
        assert [f for _, _, f in mine] == [
            [owners[t] == i for t in range(s, e)] for i, (s, e) in enumerate(expected)
        ]


@pytest.mark.parametrize("window_size, stride", [(4, 1), (4, 2), (6, 6), (5, 9), (9, 4)])
def test_windowed_rows_match_word_windows(window_size, stride):
    rng = random.Random(window_size * 10 + stride)
    longest = window_size - min(stride, window_size) + 1  # the most pieces a word may have
    sentences = [[rng.randint(1, longest) for _ in range(rng.randint(0, 12))] for _ in range(8)]
    piece_id = iter(range(10, 10_000))
    pieces = [[[next(piece_id) for _ in range(n)] for n in lengths] for lengths in sentences]
    rows, read_at = windowed_rows(
        tf.ragged.constant(pieces, tf.int32, ragged_rank=2), window_size, stride, cls_id=1, sep_id=2
    )
    expected_rows, expected_read_at, first_row = [], [], 0
    for words in pieces:
        offsets = np.cumsum([0] + [len(w) for w in words])
        windows = word_windows(offsets, window_size, stride)
        flat = [p for w in words for p in w]
        expected_rows.append([[1, *flat[offsets[a] : offsets[b]], 2] for a, b in windows])
        owners = max_context_windows(windows, len(words))
        expected_read_at.append(
            [
                [first_row + owner, 1 + offsets[word] - offsets[windows[owner][0]]]
                for word, owner in enumerate(owners)
            ]
        )
        first_row += len(windows)
    assert rows.to_list() == expected_rows  # (sentences, (windows), (pieces))
    assert read_at.to_list() == expected_read_at  # (sentences, (words), 2)


def test_imports_without_tensorflow():
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("tensorflow", "tensorflow_text", "keras"):
            raise ImportError(name)
sys.meta_path.insert(0, Block())
import bertkit.model.tokenizer, bertkit.windows
print(bertkit.windows.word_windows(__import__("numpy").array([0, 2, 3]), 2, 1))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[(0, 1), (1, 2)]"
