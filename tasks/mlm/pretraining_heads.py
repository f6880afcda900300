"""The pretraining heads' side of a checkpoint: their weights, renamed for Keras.

A Hugging Face `BertForPreTraining` checkpoint holds the masked-LM transform and
the next-sentence classifier next to the encoder; continuing pretraining from
them, rather than from fresh heads, keeps the first steps from undoing what the
encoder learned.
"""

from __future__ import annotations

import numpy as np

_HEAD_TENSORS = {  # Keras weight path -> Hugging Face BertForPreTraining tensor name
    "mlm_head/intermediate_dense/kernel": "cls.predictions.transform.dense.weight",
    "mlm_head/intermediate_dense/bias": "cls.predictions.transform.dense.bias",
    "mlm_head/intermediate_layer_norm/gamma": "cls.predictions.transform.LayerNorm.weight",
    "mlm_head/intermediate_layer_norm/beta": "cls.predictions.transform.LayerNorm.bias",
    "mlm_head/output_bias": "cls.predictions.bias",
    "nsp_head/kernel": "cls.seq_relationship.weight",
    "nsp_head/bias": "cls.seq_relationship.bias",
}


def pretraining_head_weights(tensors: dict) -> dict[str, np.ndarray]:
    """Keras weights, by path, of the pretraining heads a Hugging Face checkpoint holds whole.

    A head missing a tensor is left out (it starts fresh). Names may carry a
    `bert.` prefix, LayerNorms `gamma`/`beta`; kernels are transposed from
    PyTorch's `[out, in]`.

    Example:
        >>> heads = pretraining_head_weights({"cls.seq_relationship.weight": np.ones((2, 4)),
        ...                                   "bert.cls.seq_relationship.bias": np.zeros(2)})
        >>> {path: value.shape for path, value in heads.items()}
        {'nsp_head/kernel': (4, 2), 'nsp_head/bias': (2,)}
    """
    renamed = {
        name.removeprefix("bert.")
        .replace("LayerNorm.gamma", "LayerNorm.weight")
        .replace("LayerNorm.beta", "LayerNorm.bias"): value
        for name, value in tensors.items()
    }
    heads = {}
    for head in ("mlm_head/", "nsp_head/"):
        paths = [path for path in _HEAD_TENSORS if path.startswith(head)]
        if all(_HEAD_TENSORS[path] in renamed for path in paths):
            for path in paths:
                value = np.asarray(renamed[_HEAD_TENSORS[path]], np.float32)
                heads[path] = value.T if path.endswith("kernel") else value
    return heads
