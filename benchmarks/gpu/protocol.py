"""What `gpu_check.py` and its workers share: model shapes, settings per shape, result lines.

The workers (`jax_worker.py`, `torch_worker.py`) run as scripts in their own processes, each
with a timeout; they import this module from their own folder and end with one
`GPU_CHECK_RESULT {json}` line that the runner reads.
"""

from __future__ import annotations

import json

RESULT_PREFIX = "GPU_CHECK_RESULT "

# keras-hub's names; "base" is BERT-base (benchmarks/jax_train_throughput.py's "base").
# "tiny" is smaller than jax_train_throughput's tiny: the dry run checks the plumbing and
# one layer compiles in half the time on a CPU.
SHAPES = {
    "base": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "tiny": dict(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64),
}

# steady-state step timings and the matmul ceiling, per shape
SETTINGS = {
    "base": dict(matmul_size=8192, sequence_lengths=(128, 384), batch_size=32, steps=30, warmup=5),
    "tiny": dict(matmul_size=256, sequence_lengths=(32, 64), batch_size=4, steps=2, warmup=1),
}

MAX_POSITIONS = 512
SYNTHETIC_VOCABULARY = 30522  # the step timings' synthetic rows (ids 1000..30000)


def hf_config(shape: str, vocabulary_size: int) -> dict:
    """A `transformers.BertConfig`'s keyword arguments for `SHAPES[shape]`."""
    dims = SHAPES[shape]
    return {
        "vocab_size": vocabulary_size,
        "max_position_embeddings": MAX_POSITIONS,
        "num_hidden_layers": dims["num_layers"],
        "hidden_size": dims["hidden_dim"],
        "num_attention_heads": dims["num_heads"],
        "intermediate_size": dims["intermediate_dim"],
    }


def report(**figures) -> None:
    """The worker's result: one line the runner parses (the last such line counts)."""
    print(RESULT_PREFIX + json.dumps(figures), flush=True)


def read_result(log_text: str) -> dict | None:
    """The last result line of a worker's output, or None."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None
