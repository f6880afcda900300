"""The bi-encoder: one sentence encoder (backbone -> pooling -> optional normalization)
applied with shared weights to each text of a row, in `keras.ops` only.

`sentence_encoder` is the part a user's texts go through: `bertkit.model.pooling.pool`,
as `bertkit embed` pools, over the backbone's last hidden layer. `bi_encoder` is what
training fits: it takes the anchor's `token_ids` / `segment_ids` / `padding_mask` and the
other texts' `<text>_token_ids` / `<text>_padding_mask` (one segment each) and gives
`(batch, texts, dim)`.
"""

from __future__ import annotations

ENCODER_NAME = "sentence_encoder"


def sentence_encoder(backbone, poolings: tuple[str, ...], normalize: bool):
    """A `keras.Model` from the backbone's inputs to one vector per text, `(batch, dim)`.

    Example:
        >>> import tempfile
        >>> from bertkit.model.backbone import load_pretrained
        >>> from bertkit.testing.tiny import write_tiny_checkpoint
        >>> folder = write_tiny_checkpoint(tempfile.mkdtemp())
        >>> backbone = load_pretrained(str(folder), sequence_length=16).backbone
        >>> sentence_encoder(backbone, ("cls", "mean"), normalize=True).output.shape
        (None, 64)
    """
    import keras
    from keras import ops

    from bertkit.model.pooling import l2_normalize, pool

    tokens = ops.cast(backbone.output["sequence_output"], "float32")  # (batch, seq, hidden)
    vectors = pool(tokens, backbone.input["padding_mask"], poolings)  # (batch, dim)
    if normalize:
        vectors = l2_normalize(vectors)
    return keras.Model(backbone.input, vectors, name=ENCODER_NAME)


def bi_encoder(encoder, texts: tuple[str, ...]):
    """A `keras.Model` giving `(batch, len(texts), dim)`: `encoder` on each text of a row."""
    import keras
    from keras import ops

    inputs = {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    vectors = [encoder(inputs)]
    for text in texts[1:]:
        for name in (f"{text}_token_ids", f"{text}_padding_mask"):
            inputs[name] = keras.Input(shape=(None,), dtype="int32", name=name)
        token_ids, mask = inputs[f"{text}_token_ids"], inputs[f"{text}_padding_mask"]
        segments = ops.zeros_like(token_ids)  # one text: segment 0
        vectors.append(
            encoder({"token_ids": token_ids, "segment_ids": segments, "padding_mask": mask})
        )
    return keras.Model(inputs, ops.stack(vectors, axis=1), name="bi_encoder")
