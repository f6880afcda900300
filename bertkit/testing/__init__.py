"""Helpers for tests of bertkit and of task plugins: tiny checkpoints and data, offline.

`tiny`: a tiny vocabulary, random checkpoints and sentiment data; `contract`: the
contract test of a task plugin (`run_task_contract_test`); `preprocessor_check`: a
preprocessor's Python and TensorFlow paths agree (`check_preprocessor`); `serving`:
SavedModels called in a fresh process, with good and badly shaped requests; `cli`: the
`bertkit` command run in the test's own process (`run_bertkit`).

Example:
    >>> import tempfile
    >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())
    >>> sorted(p.name for p in folder.iterdir())
    ['config.json', 'model.safetensors', 'tokenizer_config.json', 'vocab.txt']
"""

from bertkit.testing.cli import run_bertkit
from bertkit.testing.contract import run_task_contract_test
from bertkit.testing.preprocessor_check import check_preprocessor
from bertkit.testing.serving import (
    assert_serving_refuses_bad_shapes,
    serve_bad_requests,
    serve_each_in_fresh_process,
    serve_in_fresh_process,
)
from bertkit.testing.tiny import (
    FILLER,
    NEGATIVE,
    PIECES,
    POSITIVE,
    random_bert_state,
    sentiment_sentences,
    tiny_vocabulary,
    write_sentiment_tsv,
    write_tiny_checkpoint,
)

__all__ = [
    "FILLER",
    "NEGATIVE",
    "PIECES",
    "POSITIVE",
    "assert_serving_refuses_bad_shapes",
    "check_preprocessor",
    "random_bert_state",
    "run_bertkit",
    "run_task_contract_test",
    "sentiment_sentences",
    "serve_bad_requests",
    "serve_each_in_fresh_process",
    "serve_in_fresh_process",
    "tiny_vocabulary",
    "write_sentiment_tsv",
    "write_tiny_checkpoint",
]
