"""Tag and chunk decoding in TensorFlow ops: probabilities in, entities out, in a SavedModel.

`choose_tags` picks each word's label: the most probable one, or, constrained,
the most probable sequence of labels that the tag scheme allows (Viterbi, by
tf-text's `viterbi_constrained_sequence`).

Evaluation (`bertkit_tasks.tagging.conlleval.extract_chunks`), Python prediction and the
exported model must agree on where an entity starts and ends. So the rule is not
written a second time: `chunk_boundary_tables` asks `chunk_starts` and
`chunk_ends` about every pair of labels once, and `decode_chunks` only looks
the answers up, with `tf.gather_nd` and ragged ops that trace into a graph.

Table convention: with `L = len(labels)`, both tables have shape `[L + 1, L + 1]`
and are indexed `[previous_label_id, label_id]`; index `L` stands for the edge
of the sentence (before its first word and after its last), which conlleval
reads as an `O`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_text as text

from bertkit_tasks.tagging.conlleval import OUTSIDE, chunk_ends, chunk_starts, split_tag

_TINY = 1e-30  # the floor under probabilities before their log (log 0 = -inf)


def chunk_boundary_tables(labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Where chunks start and end, for every (previous label, label) pair.

    Args:
        labels: the tag of each label id, e.g. `["O", "B-PER", "I-PER"]`.

    Returns:
        `(starts, ends)`, bool arrays of shape `[L + 1, L + 1]` (see the module
        docstring): `starts[p, t]` says a chunk starts at a word labelled `t`
        after one labelled `p`; `ends[p, t]` says the chunk holding the word
        labelled `p` ends before a word labelled `t`.

    Raises:
        ValueError: a label is not `O` or B-/I-/E-/S- and a type.

    Example:
        >>> starts, ends = chunk_boundary_tables(["O", "B-PER", "I-PER"])
        >>> starts.shape, bool(starts[3, 2]), bool(starts[1, 2])  # I-PER at start, after B-PER
        ((4, 4), True, False)
        >>> bool(ends[2, 3]), bool(ends[1, 2])  # I-PER at the end, B-PER before I-PER
        (True, False)
    """
    tags = [*labels, OUTSIDE]  # id L is the sentence edge, read as O
    starts = np.array([[chunk_starts(prev, tag) for tag in tags] for prev in tags], dtype=bool)
    ends = np.array([[chunk_ends(prev, tag) for tag in tags] for prev in tags], dtype=bool)
    return starts, ends


def chunk_type_table(labels: list[str]) -> np.ndarray:
    """The chunk type of each label id, `""` for `O` and for the sentence edge (id `L`).

    Pass it as `label_types` to `decode_chunks` for type names; an integer array
    of the same shape gives type ids instead.

    Example:
        >>> chunk_type_table(["O", "B-PER", "I-PER", "S-LOC"]).tolist()
        ['', 'PER', 'PER', 'LOC', '']
    """
    return np.array([split_tag(label)[1] for label in labels] + [""], dtype=object)


def chunk_tables(labels: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(starts, ends, label_types)`: the tables `decode_chunks` takes, for `labels`."""
    return (*chunk_boundary_tables(labels), chunk_type_table(labels))


def decode_chunks(
    tag_ids: tf.RaggedTensor, starts, ends, label_types
) -> dict[str, tf.RaggedTensor]:
    """The chunks of a batch of tagged sentences, exactly as `extract_chunks` finds them.

    Uses only TensorFlow ops, so it runs eagerly, in `tf.data`, and inside a
    `tf.function` with an input signature that a SavedModel exports.

    Args:
        tag_ids: int label ids, `[batch, (words)]`.
        starts: `[L + 1, L + 1]` bools from `chunk_boundary_tables`.
        ends: `[L + 1, L + 1]` bools from `chunk_boundary_tables`.
        label_types: `[L + 1]` type of each label id, e.g. from `chunk_type_table`;
            any dtype (names or ids), it is only gathered.

    Returns:
        `types` (gathered from `label_types`), `start_word` and `end_word`
        (int32, end exclusive), each `[batch, (chunks)]`, chunks in word order.

    Example:
        >>> labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
        >>> starts, ends = chunk_boundary_tables(labels)
        >>> tag_ids = tf.ragged.constant([[1, 2, 0, 4], [0], [4, 3]])
        >>> chunks = decode_chunks(tag_ids, starts, ends, chunk_type_table(labels))
        >>> chunks["types"].to_list()
        [[b'PER', b'LOC'], [], [b'LOC', b'LOC']]
        >>> chunks["start_word"].to_list(), chunks["end_word"].to_list()
        ([[0, 3], [], [0, 1]], [[2, 4], [], [1, 2]])
    """
    tag_ids = tf.cast(tag_ids, tf.int32)
    starts = tf.convert_to_tensor(starts, tf.bool)  # (L + 1, L + 1)
    ends = tf.convert_to_tensor(ends, tf.bool)  # (L + 1, L + 1)
    edge = tf.shape(starts)[0] - 1  # the id that stands for the sentence edge
    label = tag_ids.values  # (words in batch,)
    previous, following = _neighbour_ids(tag_ids, edge)
    is_first = tf.gather_nd(starts, tf.stack([previous, label], axis=1))  # (words in batch,)
    is_last = tf.gather_nd(ends, tf.stack([label, following], axis=1))
    word = tf.cast(tf.ragged.range(tag_ids.row_lengths()).values, tf.int32)  # within sentence
    types = tf.gather(label_types, label)

    def select(values, mask):  # (words in batch,) -> (batch, (chunks))
        return tf.ragged.boolean_mask(tag_ids.with_values(values), tag_ids.with_values(mask))

    # Each chunk has exactly one first and one last word, and chunks do not
    # overlap (tests/test_conlleval.py checks the rules guarantee it), so the
    # k-th first word of a sentence and its k-th last word bound its k-th chunk.
    return {
        "types": select(types, is_first),
        "start_word": select(word, is_first),
        "end_word": select(word + 1, is_last),
    }


def _neighbour_ids(tag_ids: tf.RaggedTensor, edge: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The label ids of each word's previous and next word, `edge` past a sentence's ends."""
    label = tag_ids.values  # (words in batch,)
    edge_id = tf.reshape(edge, [1])
    row_starts = tf.gather(tag_ids.row_starts(), tag_ids.value_rowids())
    row_limits = tf.gather(tag_ids.row_limits(), tag_ids.value_rowids())
    flat_index = tf.range(tf.size(label, out_type=row_starts.dtype), dtype=row_starts.dtype)
    # Shifting the flat values by one crosses into the neighbouring sentence at
    # the edges of each row; those places are replaced by the edge id.
    previous = tf.concat([edge_id, label], axis=0)[:-1]
    following = tf.concat([label, edge_id], axis=0)[1:]
    previous = tf.where(flat_index == row_starts, edge, previous)
    following = tf.where(flat_index == row_limits - 1, edge, following)
    return previous, following


def word_probabilities(row_logits, read_at, num_labels: int) -> list[np.ndarray]:
    """Per sentence, its words' label probabilities, read where each word is read.

    Args:
        row_logits: per model row, its (tokens, num_labels) logits.
        read_at: per sentence, (words, 2): for each word, the row and the token
            position its label is read from (its first piece, in the window
            where it has the most context).
        num_labels: the number of labels.

    Returns:
        Per sentence, a float64 (words, num_labels) array of softmax probabilities.

    Example:
        >>> rows = [np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 9.0]])]
        >>> [p.round(3).tolist() for p in word_probabilities(rows, [[[0, 1], [0, 2]]], 2)]
        [[[0.881, 0.119], [0.0, 1.0]]]
    """
    probabilities = []
    for read in read_at:
        logits = np.array(
            [row_logits[row][position] for row, position in read], dtype=np.float64
        ).reshape(-1, num_labels)  # (words, labels)
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities.append(exp / exp.sum(axis=1, keepdims=True))
    return probabilities


def sentence_batch(per_sentence: list, num_labels: int) -> tf.RaggedTensor:
    """Per-sentence `(words, num_labels)` arrays as one `[batch, (words), num_labels]` tensor.

    Example:
        >>> batch = sentence_batch([np.ones((2, 3)), np.zeros((0, 3))], 3)
        >>> batch.row_lengths().numpy().tolist(), batch.values.shape.as_list()
        ([2, 0], [2, 3])
    """
    flat = np.concatenate(
        [np.zeros((0, num_labels)), *(np.reshape(rows, (-1, num_labels)) for rows in per_sentence)]
    )
    return tf.RaggedTensor.from_row_lengths(
        flat.astype(np.float32), [len(rows) for rows in per_sentence]
    )


def choose_tags(probabilities: tf.RaggedTensor, allowed=None, transitions=None) -> tf.RaggedTensor:
    """Each word's label id, from its label probabilities (and a CRF's transition scores).

    Without `allowed` or `transitions`, a word's label is its most probable one
    (transformers' rule). With `allowed`, the labels of a sentence are the sequence
    with the highest product of probabilities among those whose every transition is
    allowed (Viterbi): no `I-PER` after `O` in iob2, no `B-` left open in bioes.
    With `transitions` (a CRF head's learned scores), a sequence's score adds them to
    its words' log-probabilities; `allowed` still rules out the ill-formed ones. A
    sentence that no allowed sequence fits keeps the most probable labels.

    A CRF scores a sequence by its words' logits; the log-probabilities differ from
    them by one constant per word (its log-sum-exp), the same for every sequence, so
    the best sequence is the CRF's.

    Args:
        probabilities: `[batch, (words), L]` float probabilities.
        allowed: `[L + 1, L + 1]` bools from `bertkit_tasks.tagging.schemes.allowed_transitions`
            (index `L`: the sentence edge), or None.
        transitions: `[L + 1, L + 1]` float scores in the same layout
            (`bertkit_tasks.tagging.crf.TransitionScores`), or None.

    Returns:
        `[batch, (words)]` int32 label ids.

    Example:
        >>> probabilities = tf.ragged.constant(  # O, B-PER, I-PER
        ...     [[[0.6, 0.3, 0.1], [0.3, 0.1, 0.6]]], ragged_rank=1)
        >>> choose_tags(probabilities).to_list()  # O I-PER: ill-formed iob2
        [[0, 2]]
        >>> from bertkit_tasks.tagging.schemes import allowed_transitions
        >>> allowed = allowed_transitions(["O", "B-PER", "I-PER"], "iob2")
        >>> choose_tags(probabilities, allowed).to_list()  # 0.3 x 0.6 beats 0.6 x 0.3 (O O)
        [[1, 2]]
        >>> learned = np.zeros((4, 4), "float32")
        >>> learned[0, 0] = 2.0  # O after O: e^2 times likelier
        >>> choose_tags(probabilities, allowed, learned).to_list()
        [[0, 0]]
    """
    probabilities = tf.cast(probabilities, tf.float32)
    most_probable = tf.argmax(probabilities.values, -1, output_type=tf.int32)  # (words,)
    argmax_ids = probabilities.with_values(most_probable)  # (batch, (words))
    if allowed is None and transitions is None:
        return argmax_ids
    log_probabilities = tf.math.log(tf.maximum(probabilities.values, _TINY))
    best = text.viterbi_constrained_sequence(
        probabilities.with_values(log_probabilities),
        transition_weights=None if transitions is None else tf.cast(transitions, tf.float32),
        allowed_transitions=None if allowed is None else tf.convert_to_tensor(allowed, tf.bool),
        use_log_space=True,
        use_start_and_end_states=True,
    )  # -1 where no sequence is allowed
    return argmax_ids.with_values(
        tf.where(best.values < 0, most_probable, tf.cast(best.values, tf.int32))
    )


def graph_entities(
    texts, byte_starts, byte_ends, word_logits, labels: list[str], allowed=None, transitions=None
) -> dict:
    """Entities of raw texts from their words' logits, in TensorFlow ops (for SavedModels).

    The same rule as Python prediction: a word's tag comes from `choose_tags`
    (constrained by `allowed`, with a CRF's `transitions`, if given), chunks from
    `decode_chunks`, an entity's score is the mean probability of its words' chosen tags.

    Args:
        texts: (batch,) strings.
        byte_starts, byte_ends: (batch, (words)) byte offsets of the words.
        word_logits: (words in batch, num_labels) logits, words in order.
        labels: the tag of each label id.
        allowed: None, or the `[L + 1, L + 1]` transitions `choose_tags` keeps to.
        transitions: None, or a CRF head's `[L + 1, L + 1]` scores `choose_tags` adds.

    Returns:
        `entity_text`, `entity_type`, `entity_start`, `entity_end` (characters,
        end exclusive) and `entity_score`, each (batch, most entities) padded
        with "", "", -1, -1 and 0, and `entity_count` (batch,).

    Example:
        >>> texts = tf.constant(["Ann met Bob"])
        >>> starts, ends = tf.ragged.constant([[0, 4, 8]]), tf.ragged.constant([[3, 7, 11]])
        >>> logits = tf.constant([[0.0, 5.0], [5.0, 0.0], [0.0, 5.0]])  # B-PER, O, B-PER
        >>> found = graph_entities(texts, starts, ends, logits, ["O", "B-PER"])
        >>> found["entity_text"].numpy().tolist(), found["entity_start"].numpy().tolist()
        ([[b'Ann', b'Bob']], [[0, 8]])
    """
    from bertkit.model.tokenizer import batch_substrings

    probabilities = tf.nn.softmax(tf.cast(word_logits, tf.float32))  # (words, num_labels)
    tag_ids = choose_tags(byte_starts.with_values(probabilities), allowed, transitions)
    chunks = decode_chunks(tag_ids, *chunk_tables(labels))  # each (batch, (entities))
    # flat word index of each entity's first and last word
    base = tf.gather(tag_ids.row_starts(), chunks["start_word"].value_rowids())
    first = base + tf.cast(chunks["start_word"].values, tf.int64)
    last = base + tf.cast(chunks["end_word"].values, tf.int64) - 1
    chosen = tf.gather(probabilities, tag_ids.values, batch_dims=1)  # (words,)
    scores = tf.reduce_mean(tf.gather(chosen, tf.ragged.range(first, last + 1)), axis=1)
    entity_texts, start, end = batch_substrings(  # characters
        tf.gather(texts, chunks["start_word"].value_rowids()),
        tf.gather(byte_starts.values, first),
        tf.gather(byte_ends.values, last),
    )

    def dense(values, default):  # (entities in batch,) -> (batch, most entities)
        return chunks["types"].with_values(values).to_tensor(default)

    return {
        "entity_text": dense(entity_texts, ""),
        "entity_type": chunks["types"].to_tensor(""),
        "entity_start": dense(tf.cast(start, tf.int32), -1),
        "entity_end": dense(tf.cast(end, tf.int32), -1),
        "entity_score": dense(scores, 0.0),
        "entity_count": tf.cast(chunks["types"].row_lengths(), tf.int32),
    }
