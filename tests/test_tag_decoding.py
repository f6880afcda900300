"""In-graph chunk decoding gives exactly the chunks of `extract_chunks`, eagerly and exported."""

import random

import numpy as np
import pytest
import tensorflow as tf

from bertkit_tasks.tagging.conlleval import extract_chunks
from bertkit_tasks.tagging.decoding import chunk_boundary_tables, chunk_type_table, decode_chunks
from bertkit_tasks.tagging.schemes import chunks_to_tags

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
EDGE = len(LABELS)  # the sentence-edge id, 7

IOB_LABELS = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC", "MISC") for p in "BI"]
BIOES_LABELS = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC", "MISC") for p in "BIES"]
# O in the middle: nothing may assume O is id 0.
MIXED_LABELS = BIOES_LABELS[1:7] + ["O"] + BIOES_LABELS[7:]


def decode(tag_ids, labels=LABELS):
    starts, ends = chunk_boundary_tables(labels)
    return decode_chunks(tag_ids, starts, ends, chunk_type_table(labels))


def as_chunks(decoded):
    """Decoded ragged tensors as one list of `(type, start, end)` per sentence."""
    rows = zip(
        decoded["types"].to_list(),
        decoded["start_word"].to_list(),
        decoded["end_word"].to_list(),
        strict=True,
    )
    return [[(t.decode(), s, e) for t, s, e in zip(*row, strict=True)] for row in rows]


def test_tables_follow_the_edge_convention():
    starts, ends = chunk_boundary_tables(LABELS)
    assert starts.shape == ends.shape == (EDGE + 1, EDGE + 1)
    assert starts.dtype == ends.dtype == np.bool_
    assert starts[EDGE, 2]  # I-PER as the first word starts a chunk
    assert not starts[1, 2]  # I-PER after B-PER continues it
    assert starts[2, 4]  # I-LOC after I-PER: type change
    assert ends[2, EDGE]  # I-PER as the last word ends its chunk
    assert ends[5, 4]  # E-LOC then I-LOC
    assert not ends[1, 2]
    assert not starts[:, 0].any() and not starts[:, EDGE].any()  # O and the edge start nothing
    assert not ends[0, :].any() and not ends[EDGE, :].any()  # nor end anything


def test_type_table():
    assert chunk_type_table(LABELS).tolist() == ["", "PER", "PER", "LOC", "LOC", "LOC", "LOC", ""]
    with pytest.raises(ValueError, match="unknown tag 'PER'"):
        chunk_boundary_tables(["O", "PER"])


# O=0 B-PER=1 I-PER=2 B-LOC=3 I-LOC=4 E-LOC=5 S-LOC=6
HAND_BATCH = [
    [1, 2, 0, 3, 4, 5],  # B-PER I-PER O B-LOC I-LOC E-LOC
    [],
    [2, 2, 1],  # IOB1: I-PER I-PER B-PER
    [0, 2, 4],  # ill-formed: O I-PER I-LOC
    [6, 6, 5, 3],  # S-LOC S-LOC E-LOC B-LOC
    [0],
]
HAND_CHUNKS = [
    [("PER", 0, 2), ("LOC", 3, 6)],
    [],
    [("PER", 0, 2), ("PER", 2, 3)],
    [("PER", 1, 2), ("LOC", 2, 3)],
    [("LOC", 0, 1), ("LOC", 1, 2), ("LOC", 2, 3), ("LOC", 3, 4)],
    [],
]


def test_hand_cases():
    tag_ids = tf.ragged.constant(HAND_BATCH, dtype=tf.int32)
    assert as_chunks(decode(tag_ids)) == HAND_CHUNKS


def test_int64_ids_integer_types_and_an_empty_batch():
    starts, ends = chunk_boundary_tables(LABELS)
    type_ids = np.array([-1, 0, 0, 1, 1, 1, 1, -1], dtype=np.int32)  # PER=0, LOC=1
    decoded = decode_chunks(tf.ragged.constant([[6, 0, 1]], tf.int64), starts, ends, type_ids)
    assert decoded["types"].to_list() == [[1, 0]]
    assert decoded["start_word"].dtype == tf.int32
    empty = decode(tf.ragged.constant([], dtype=tf.int32, ragged_rank=1))
    assert empty["start_word"].to_list() == []


@pytest.mark.parametrize(
    "labels", [IOB_LABELS, BIOES_LABELS, MIXED_LABELS], ids=["iob", "bioes", "mixed"]
)
def test_random_sequences_match_extract_chunks(labels):
    rng = random.Random(len(labels))
    types = ["PER", "LOC", "MISC"]
    batch = [[rng.randrange(len(labels)) for _ in range(rng.randint(0, 12))] for _ in range(300)]
    # Also well-formed sequences, written from random chunks in each scheme that fits.
    schemes = ["iob1", "iob2"] if labels is IOB_LABELS else ["iob1", "iob2", "bioes"]
    for _ in range(100):
        tags = chunks_to_tags(random_chunks(rng, types, 12), 12, rng.choice(schemes))
        batch.append([labels.index(tag) for tag in tags])
    decoded = as_chunks(decode(tf.ragged.constant(batch, dtype=tf.int32), labels))
    for ids, chunks in zip(batch, decoded, strict=True):
        assert chunks == extract_chunks([labels[i] for i in ids]), ids


def random_chunks(rng, types, length):
    chunks, position = [], 0
    while position < length:
        size = rng.randint(1, 3)
        if rng.random() < 0.7 and position + size <= length:
            chunks.append((rng.choice(types), position, position + size))
        position += size if rng.random() < 0.8 else size + 1
    return chunks


def traced_decoder():
    starts, ends = chunk_boundary_tables(LABELS)
    label_types = chunk_type_table(LABELS)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)])
    def decode_batch(tag_ids):
        return decode_chunks(tag_ids, starts, ends, label_types)

    return decode_batch


def test_runs_inside_a_tf_function_with_an_input_signature():
    decode_batch = traced_decoder()
    assert as_chunks(decode_batch(tf.ragged.constant(HAND_BATCH, dtype=tf.int32))) == HAND_CHUNKS
    assert as_chunks(decode_batch(tf.ragged.constant([[0, 2]], dtype=tf.int32))) == [
        [("PER", 1, 2)]
    ]
    assert decode_batch.experimental_get_tracing_count() == 1


def test_survives_savedmodel_export(tmp_path):
    module = tf.Module()
    module.decode = traced_decoder()
    tf.saved_model.save(module, str(tmp_path / "decoder"))
    loaded = tf.saved_model.load(str(tmp_path / "decoder"))
    assert as_chunks(loaded.decode(tf.ragged.constant(HAND_BATCH, dtype=tf.int32))) == HAND_CHUNKS


def test_word_probabilities_read_each_word_at_its_position():
    from bertkit_tasks.tagging.decoding import word_probabilities

    rows = [np.array([[0.0, 0.0], [3.0, 1.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [0.0, 4.0]])]
    # sentence 0: its word 0 in row 0 position 1, its word 1 in row 1 position 1
    (probabilities,) = word_probabilities(rows, [np.array([[0, 1], [1, 1]])], 2)
    assert probabilities.argmax(axis=1).tolist() == [0, 1]
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert word_probabilities(rows, [np.zeros((0, 2), np.int64)], 2)[0].shape == (0, 2)


def test_graph_entities_character_offsets_and_scores():
    from bertkit_tasks.tagging.decoding import graph_entities

    labels = ["O", "B-PER", "I-PER", "B-LOC"]
    texts = tf.constant(["Zoë Ann in Köln", "", "x"])
    starts = tf.ragged.constant([[0, 5, 9, 12], [], [0]], tf.int64)  # bytes
    ends = tf.ragged.constant([[4, 8, 11, 17], [], [1]], tf.int64)
    logits = tf.constant(
        [[0, 9, 0, 0], [0, 0, 9, 0], [9, 0, 0, 0], [0, 0, 0, 9], [9, 0, 0, 0]], tf.float32
    )
    found = graph_entities(texts, starts, ends, logits, labels)
    assert found["entity_count"].numpy().tolist() == [2, 0, 0]
    assert [t.decode() for t in found["entity_text"].numpy()[0]] == ["Zoë Ann", "Köln"]
    assert found["entity_type"].numpy()[0].tolist() == [b"PER", b"LOC"]
    assert found["entity_start"].numpy()[0].tolist() == [0, 11]  # characters, not bytes
    assert found["entity_end"].numpy()[0].tolist() == [7, 15]
    assert found["entity_start"].numpy()[1].tolist() == [-1, -1]
    probability = float(tf.nn.softmax(logits[0])[1])
    assert abs(found["entity_score"].numpy()[0][0] - probability) < 1e-6
