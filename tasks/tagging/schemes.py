"""Tag schemes for chunks (entities) and conversion between them.

- `iob1`, original CoNLL-2003: `I-` marks every word of a chunk; `B-` only
  starts a chunk that directly follows a chunk of the same type.
- `iob2` (BIO): `B-` starts every chunk, `I-` continues it.
- `bioes`: `S-` marks a one-word chunk; longer ones are `B-`, `I-`..., `E-`.

Every scheme is read with conlleval's chunk rules (`bertkit_tasks.tagging.conlleval`), so a
conversion keeps exactly the chunks that evaluation sees, ill-formed input
included: `convert_tags(["O", "I-PER"], "iob2", "iob2")` gives `["O", "B-PER"]`.
"""

from __future__ import annotations

import numpy as np

from bertkit_tasks.tagging.conlleval import OUTSIDE, extract_chunks, split_tag

SCHEMES = ("iob1", "iob2", "bioes")
_SCHEME_PREFIXES = {"iob1": ("B", "I"), "iob2": ("B", "I"), "bioes": ("B", "I", "E", "S")}


class TagSchemeError(ValueError):
    """A tag that breaks a scheme, at word `word_index` (0-based) of its sentence.

    The message reads "word <word_index + 1>: <problem>"; `problem` is the part
    after it, for callers that name the place their own way.

    Example:
        >>> error = TagSchemeError(1, "'I-PER' is not well-formed iob2 here")
        >>> str(error), error.word_index
        ("word 2: 'I-PER' is not well-formed iob2 here", 1)
    """

    def __init__(self, word_index: int, problem: str):
        super().__init__(f"word {word_index + 1}: {problem}")
        self.word_index, self.problem = word_index, problem


def check_scheme(scheme: str) -> None:
    """Raises ValueError, naming the known schemes, if `scheme` is not one of `SCHEMES`.

    Example:
        >>> check_scheme("bio")
        Traceback (most recent call last):
        ...
        ValueError: unknown tag scheme 'bio'; expected one of iob1, iob2, bioes
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")


def convert_tags(tags: list[str], source_scheme: str, target_scheme: str) -> list[str]:
    """Rewrites one sentence's tags from `source_scheme` into `target_scheme`.

    The chunks are kept exactly as conlleval reads them, so converting and then
    evaluating gives the same scores as evaluating the original tags.

    Raises:
        ValueError: a scheme is unknown, or a tag uses a prefix `source_scheme`
            does not have (an `E-` tag in `iob2` data); the message names the word.

    Example:
        >>> convert_tags(["I-PER", "B-PER", "O", "I-LOC", "I-LOC"], "iob1", "iob2")
        ['B-PER', 'B-PER', 'O', 'B-LOC', 'I-LOC']
        >>> convert_tags(["B-PER", "B-PER", "O", "B-LOC", "I-LOC"], "iob2", "bioes")
        ['S-PER', 'S-PER', 'O', 'B-LOC', 'E-LOC']
        >>> convert_tags(["S-PER", "S-PER", "B-LOC", "E-LOC"], "bioes", "iob1")
        ['I-PER', 'B-PER', 'I-LOC', 'I-LOC']
    """
    _check_prefixes(tags, source_scheme)
    return chunks_to_tags(extract_chunks(tags), len(tags), target_scheme)


def chunks_to_tags(chunks: list[tuple[str, int, int]], length: int, scheme: str) -> list[str]:
    """Writes `(type, start, end)` chunks (end exclusive) as `length` tags in `scheme`.

    Raises:
        ValueError: the scheme is unknown, or the chunks overlap or leave `range(length)`.

    Example:
        >>> chunks_to_tags([("PER", 0, 1), ("PER", 1, 3)], 4, "iob1")
        ['I-PER', 'B-PER', 'I-PER', 'O']
        >>> chunks_to_tags([("PER", 0, 1), ("PER", 1, 3)], 4, "bioes")
        ['S-PER', 'B-PER', 'E-PER', 'O']
    """
    check_scheme(scheme)
    tags, previous_end, previous_type = [OUTSIDE] * length, 0, None
    for type_, start, end in sorted(chunks, key=lambda chunk: chunk[1]):
        if not previous_end <= start < end <= length:
            raise ValueError(f"chunk {(type_, start, end)} overlaps another or leaves 0..{length}")
        follows_same_type = start == previous_end and type_ == previous_type
        tags[start:end] = _chunk_tags(type_, end - start, scheme, follows_same_type)
        previous_end, previous_type = end, type_
    return tags


def validate_tags(tags: list[str], scheme: str) -> None:
    """Checks that `tags` are well-formed in `scheme`, as a strict reader of it expects.

    Well-formed means written the one way `scheme` writes their chunks: no `I-`
    after `O` in `iob2`, no `B-` at the start of a chunk in `iob1` unless it
    follows a chunk of its type, every `bioes` chunk closed by `E-` or `S-`.
    Ill-formed tags still have a meaning (see `convert_tags`); this is for data
    that claims to follow a scheme.

    Raises:
        TagSchemeError: (a `ValueError`) with the word's index, so a caller can
            point at the word: "word 2: 'I-PER' is not well-formed iob2 here;
            iob2 writes 'B-PER'".

    Example:
        >>> validate_tags(["B-PER", "I-PER", "O"], "iob2")
        >>> try:
        ...     validate_tags(["O", "I-PER"], "iob2")
        ... except TagSchemeError as error:
        ...     print(error.word_index, error)
        1 word 2: 'I-PER' is not well-formed iob2 here; iob2 writes 'B-PER'
    """
    _check_prefixes(tags, scheme)
    expected = chunks_to_tags(extract_chunks(tags), len(tags), scheme)
    for position, (tag, wanted) in enumerate(zip(tags, expected, strict=True)):
        if tag != wanted:
            raise TagSchemeError(
                position, f"{tag!r} is not well-formed {scheme} here; {scheme} writes {wanted!r}"
            )


def allowed_transitions(labels: list[str], scheme: str) -> np.ndarray:
    """Which label may follow which in well-formed `scheme` tags (`validate_tags`' sense).

    Constrained decoding (`bertkit_tasks.tagging.decoding.choose_tags`) picks the most
    probable tag sequence among those these transitions allow. Well-formedness
    in every scheme depends only on neighbouring tags, so this table decides it.

    Args:
        labels: the tag of each label id, e.g. `["O", "B-PER", "I-PER"]`.
        scheme: the scheme the labels are written in.

    Returns:
        `[L + 1, L + 1]` bools, `[previous_label_id, label_id]`; index `L` is the
        sentence edge (`[L, t]`: a sentence may start with `t`; `[p, L]`: it may
        end with `p`), the convention of `bertkit_tasks.tagging.decoding`.

    Example:
        >>> allowed = allowed_transitions(["O", "B-PER", "I-PER"], "iob2")
        >>> bool(allowed[1, 2]), bool(allowed[0, 2]), bool(allowed[3, 2])  # I-PER after B, O, edge
        (True, False, False)
    """
    check_scheme(scheme)
    tags = [split_tag(label) for label in labels] + [(OUTSIDE, "")]  # the edge reads as O
    return np.array(
        [[_may_follow(previous, tag, scheme) for tag in tags] for previous in tags], dtype=bool
    )


def _may_follow(previous: tuple[str, str], tag: tuple[str, str], scheme: str) -> bool:
    """Whether `tag` may directly follow `previous`, both `(prefix, type)`, in `scheme`."""
    (previous_prefix, previous_type), (prefix, type_) = previous, tag
    continues = previous_prefix in ("B", "I") and previous_type == type_  # inside the same chunk
    if scheme == "iob2":  # I- only continues a chunk
        return prefix != "I" or continues
    if scheme == "iob1":  # B- only right after a chunk of its type
        return prefix != "B" or continues
    # bioes: a chunk opened by B- goes on with I- and closes with E-
    if previous_prefix in ("B", "I"):
        return prefix in ("I", "E") and type_ == previous_type
    return prefix not in ("I", "E")


def _check_prefixes(tags: list[str], scheme: str) -> None:
    check_scheme(scheme)
    allowed = _SCHEME_PREFIXES[scheme]
    for position, tag in enumerate(tags):
        try:
            prefix, _ = split_tag(tag)
        except ValueError as error:
            raise TagSchemeError(position, str(error)) from None
        if prefix != OUTSIDE and prefix not in allowed:
            raise TagSchemeError(
                position,
                f"{tag!r} does not belong to scheme {scheme}, "
                f"which uses O, {', '.join(p + '-' for p in allowed)}",
            )


def _chunk_tags(type_: str, size: int, scheme: str, follows_same_type: bool) -> list[str]:
    """The tags of one chunk of `size` words."""
    if scheme == "bioes":
        if size == 1:
            return [f"S-{type_}"]
        return [f"B-{type_}"] + [f"I-{type_}"] * (size - 2) + [f"E-{type_}"]
    # iob1 needs B- only where I- would merge this chunk into the one before it.
    first = "B" if scheme == "iob2" or follows_same_type else "I"
    return [f"{first}-{type_}"] + [f"I-{type_}"] * (size - 1)
