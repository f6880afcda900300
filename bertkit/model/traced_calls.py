"""TensorFlow work repeated eagerly, run as one traced graph call from its second time.

Eagerly, each TensorFlow op is dispatched from Python: tokenizing one sentence is about a
hundred small ops (about 38 ms on a 2-core CPU, more than MiniLM's forward pass), decoding
one sentence's tags about as many. Traced, each is one graph call (about 2 ms). Tracing
costs more than one eager call (about 0.5 s), so a call made once (a training run's
featurization, a test) stays eager: `TracedCalls` traces a call from its second time, and
only where a loaded model turned it on (`bertkit.load` calls the tokenizer's
`trace_repeated_calls`) to serve many small calls. The signature leaves every dimension
unknown, so batches of any size share one trace.

A model's tokenizer holds its `TracedCalls` (`tokenizer.traced_calls`), and tasks run
their own repeated TensorFlow work through it (tagging's Viterbi and chunk decoding, span
QA's span search), so that one switch covers a loaded model's whole eager path.
"""

from __future__ import annotations

import functools


class TracedCalls:
    """Runs `function(tensors)` eagerly the first time a `name` is called with tensors of
    this structure, as a `tf.function` from the second; always eagerly while off.

    Example:
        >>> import tensorflow as tf
        >>> calls = TracedCalls()
        >>> calls.enable()
        >>> [int(calls("double", lambda x: 2 * x, tf.constant([1, 2, 3]))[0]) for _ in range(3)]
        [2, 2, 2]
        >>> calls.traced_names()
        ['double']
    """

    def __init__(self):
        self.enabled = False
        self._counts: dict = {}
        self._traced: dict = {}

    def enable(self) -> None:
        self.enabled = True

    def traced_names(self) -> list[str]:
        """The names of the calls that run traced, each once."""
        return sorted({name for name, _ in self._traced})

    def __call__(self, name: str, function, tensors):
        """`function(tensors)`, traced from the second call of `name` (see the class).

        `name` must say everything `function` closes over that changes its graph
        (`tokenize_words(max_pieces=2)`; a tagger's labels and decoding: tasks that share
        a tokenizer share its `TracedCalls`); `tensors` is a tensor, a ragged tensor, or a
        list or tuple of them.
        """
        import tensorflow as tf

        if not self.enabled or not tf.executing_eagerly() or not _only_tensors(tensors):
            return function(tensors)
        signature = tf.nest.map_structure(_any_shape, tensors)
        key = (name, repr(signature))
        count = self._counts.get(key, 0)
        self._counts[key] = count + 1
        if count == 0:
            return function(tensors)
        if key not in self._traced:
            self._traced[key] = tf.function(function, input_signature=[signature], autograph=False)
        return self._traced[key](tensors)


def _only_tensors(structure) -> bool:
    import tensorflow as tf

    return not isinstance(structure, dict) and all(
        isinstance(value, (tf.Tensor, tf.RaggedTensor)) for value in tf.nest.flatten(structure)
    )


def _any_shape(value):
    """`value`'s type with every dimension unknown."""
    import tensorflow as tf

    if isinstance(value, tf.RaggedTensor):
        return tf.RaggedTensorSpec(
            [None] * value.shape.rank, value.dtype, value.ragged_rank, value.row_splits.dtype
        )
    return tf.TensorSpec([None] * value.shape.rank, value.dtype)


def traced_method(method):
    """`method(self, tensors, *static, **options)` through `self.traced_calls`, named by the
    method and its static arguments."""

    @functools.wraps(method)
    def call(self, tensors, *static, **options):
        name = f"{method.__name__}{static}{sorted(options.items())}"
        return self.traced_calls(
            name, lambda values: method(self, values, *static, **options), tensors
        )

    return call
