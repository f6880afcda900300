"""SQuAD rows: answer targets in the numpy rows, answer text from the in-graph rows.

That `featurize`'s rows equal `serve`'s is the contract kit's check
(`bertkit.testing.check_preprocessor`, in tests/test_span_qa.py).
"""

import numpy as np
import tensorflow as tf

from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit_tasks.span_qa.preprocessor import (
    graph_answer_text,
    graph_question_windows,
    question_window_rows,
)

TOKENIZER = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], True)


def test_answer_positions_only_in_windows_that_hold_it_whole():
    context = (np.arange(10, 20), np.arange(10), np.arange(10) + 1)
    rows = question_window_rows(
        np.array([7, 8]),
        context,
        (3, 5),
        cls_id=2,
        sep_id=3,
        sequence_length=9,
        doc_stride=2,
        training=False,
    )
    # 4 context pieces per window ([CLS] q q [SEP] .... [SEP]): (0, 4), (2, 6), (4, 8), (6, 10)
    targets = [(row["start_positions"], row["end_positions"]) for row in rows]
    assert targets == [(0, 0), (5, 7), (0, 0), (0, 0)]
    assert rows[1]["char_starts"].tolist() == [-1, -1, -1, -1, 2, 3, 4, 5, -1]
    assert rows[1]["token_ids"][rows[1]["start_positions"]] == context[0][3]


def test_answer_text_in_characters_and_empty_when_not_answered():
    windows = graph_question_windows(
        TOKENIZER,
        tf.ragged.constant([[7], [7]], tf.int64),
        tf.ragged.constant([[10, 11], [12]], tf.int64),
        16,
        8,
    )
    texts, starts, ends = graph_answer_text(  # "Zoë runs" at positions 3-4 of window 0
        tf.constant(["Zoë runs", "none"]),
        tf.ragged.constant([[0, 5], [0]], tf.int64),
        tf.ragged.constant([[4, 9], [4]], tf.int64),
        windows,
        tf.constant([0, 1]),
        tf.constant([3, 0]),
        tf.constant([4, 0]),
        tf.constant([True, False]),
    )
    assert [t.decode() for t in texts.numpy()] == ["Zoë runs", ""]
    assert starts.numpy().tolist()[0] == 0 and ends.numpy().tolist()[0] == 8
