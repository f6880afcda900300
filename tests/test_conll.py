"""CoNLL and JSON-lines readers, and tag scheme conversion."""

import itertools
import random

import pytest

from bertkit.errors import UserError
from bertkit_tasks.tagging.conll import TaggedSentence, read_conll, read_tagged_jsonl
from bertkit_tasks.tagging.conlleval import extract_chunks
from bertkit_tasks.tagging.schemes import SCHEMES, chunks_to_tags, convert_tags, validate_tags

CONLL_2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""


def write(tmp_path, text, name="train.txt", newline="\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def user_error(reader, *args, **kwargs) -> str:
    with pytest.raises(UserError) as caught:
        reader(*args, **kwargs)
    return str(caught.value)


# ---- read_conll ----


def test_reads_conll_2003(tmp_path):
    path = write(tmp_path, CONLL_2003)
    assert read_conll(path) == [
        TaggedSentence(("EU", "rejects", "German"), ("I-ORG", "O", "I-MISC"), str(path), 3),
        TaggedSentence(("Peter", "Blackburn"), ("I-PER", "I-PER"), str(path), 7),
    ]


@pytest.mark.parametrize(
    "tag_column, first_tags", [(1, ("NNP", "VBZ", "JJ")), (-2, ("B-NP", "B-VP", "B-NP"))]
)
def test_tag_column_picks_a_column(tmp_path, tag_column, first_tags):
    sentences = read_conll(write(tmp_path, CONLL_2003), tag_column=tag_column)
    assert sentences[0].tags == first_tags
    assert sentences[0].words == ("EU", "rejects", "German")


@pytest.mark.parametrize(
    "text",
    [
        "a O\nb B-PER\n\nc O",  # no final newline
        "a O\nb B-PER\n\nc O\n\n\n",  # several blank lines at the end
        "\n\na O\nb B-PER\n  \n\t\nc O\n",  # blank lines that hold spaces or tabs
        "\ufeffa O\nb\tB-PER\n\nc  O\n",  # byte-order mark, tab and double space
    ],
)
def test_layout_variations(tmp_path, text):
    sentences = read_conll(write(tmp_path, text))
    assert [(s.words, s.tags) for s in sentences] == [
        (("a", "b"), ("O", "B-PER")),
        (("c",), ("O",)),
    ]


def test_windows_line_endings(tmp_path):
    sentences = read_conll(write(tmp_path, CONLL_2003, newline="\r\n"))
    assert sentences[1].tags == ("I-PER", "I-PER")  # no stray "\r"
    assert [s.line for s in sentences] == [3, 7]


def test_docstart_without_blank_line_ends_the_sentence(tmp_path):
    sentences = read_conll(write(tmp_path, "a O\n-DOCSTART- O\nb O\n"))
    assert [(s.words, s.line) for s in sentences] == [(("a",), 1), (("b",), 3)]


def test_no_break_space_stays_inside_a_token(tmp_path):
    [sentence] = read_conll(write(tmp_path, "10\u00a0000 O\n"))
    assert sentence.words == ("10\u00a0000",)


def test_missing_file(tmp_path):
    path = tmp_path / "missing.txt"
    assert user_error(read_conll, path) == f"{path}: file not found"


def test_column_count_differs_from_the_first_line(tmp_path):
    path = write(tmp_path, CONLL_2003.replace("Blackburn NNP I-NP I-PER", "Blackburn I-PER"))
    assert user_error(read_conll, path) == f"{path}:8: expected 4 columns as on line 3, found 2"


def test_missing_tag(tmp_path):
    path = write(tmp_path, "\nEU\nrejects\n")
    assert user_error(read_conll, path) == (
        f"{path}:2: expected a token and a tag, found only 1 column"
    )
    path = write(tmp_path, "EU I-ORG\nrejects\n")
    assert user_error(read_conll, path) == f"{path}:2: expected 2 columns as on line 1, found 1"


@pytest.mark.parametrize("tag_column", [4, -5, 0])
def test_tag_column_out_of_range(tmp_path, tag_column):
    path = write(tmp_path, CONLL_2003)
    assert user_error(read_conll, path, tag_column=tag_column) == (
        f"{path}:3: tag_column {tag_column} is out of range for a line of 4 columns "
        "(column 0 is the token)"
    )


def test_empty_file_and_bad_encoding(tmp_path):
    path = write(tmp_path, "-DOCSTART- O\n\n")
    assert user_error(read_conll, path) == f"{path}: no sentences found"
    path = tmp_path / "latin1.txt"
    path.write_bytes("a O\nM\u00fcller I-PER\n".encode("latin-1"))
    assert user_error(read_conll, path) == f"{path}:2: not UTF-8 text (byte 5)"


# ---- read_tagged_jsonl ----


def test_reads_jsonl(tmp_path):
    path = write(
        tmp_path,
        '{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"], "id": 7}\n'
        "\n"
        '{"tokens": ["Peter"], "tags": ["S-PER"]}',
        name="train.jsonl",
        newline="\r\n",
    )
    assert read_tagged_jsonl(path) == [
        TaggedSentence(("EU", "rejects"), ("B-ORG", "O"), str(path), 1),
        TaggedSentence(("Peter",), ("S-PER",), str(path), 3),
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"tokens": ["a"], "tags": ["O"]', "invalid JSON: Expecting ',' delimiter"),
        ('["a", "O"]', 'expected a JSON object like {"tokens": [...], "tags": [...]}'),
        ('{"tokens": ["a"]}', "missing key 'tags'"),
        ('{"words": ["a"], "tags": ["O"]}', "missing key 'tokens'"),
        ('{"tokens": ["a", "b"], "tags": ["O"]}', "2 tokens but 1 tags"),
        ('{"tokens": ["a"], "tags": "O"}', "tags: expected a list of non-empty strings, got 'O'"),
        ('{"tokens": ["a"], "tags": [""]}', "tags: expected a list of non-empty strings, got ['']"),
        ('{"tokens": [], "tags": []}', "tokens: empty list; a sentence needs at least one word"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, '{"tokens": ["ok"], "tags": ["O"]}\n' + line + "\n", name="d.jsonl")
    assert user_error(read_tagged_jsonl, path) == f"{path}:2: {message}"


def test_jsonl_missing_or_empty_file(tmp_path):
    assert (
        user_error(read_tagged_jsonl, tmp_path / "no.jsonl")
        == f"{tmp_path / 'no.jsonl'}: file not found"
    )
    path = write(tmp_path, "\n", name="empty.jsonl")
    assert user_error(read_tagged_jsonl, path) == f"{path}: no sentences found"


# ---- tag schemes ----

# One sentence written in each scheme, by hand; columns line up word by word.
SPELLINGS = [
    {  # CoNLL-2003's first sentence: one-word chunks only
        "iob1": "I-ORG O I-MISC O O O I-MISC O O".split(),
        "iob2": "B-ORG O B-MISC O O O B-MISC O O".split(),
        "bioes": "S-ORG O S-MISC O O O S-MISC O O".split(),
    },
    {  # two PER chunks side by side, a three-word LOC, two MISC side by side, then ORG
        "iob1": "I-PER I-PER B-PER O I-LOC I-LOC I-LOC I-MISC B-MISC I-ORG".split(),
        "iob2": "B-PER I-PER B-PER O B-LOC I-LOC I-LOC B-MISC B-MISC B-ORG".split(),
        "bioes": "B-PER E-PER S-PER O B-LOC I-LOC E-LOC S-MISC S-MISC S-ORG".split(),
    },
    {  # chunks of different types side by side need no B- in iob1
        "iob1": "I-PER I-LOC I-LOC B-LOC".split(),
        "iob2": "B-PER B-LOC I-LOC B-LOC".split(),
        "bioes": "S-PER B-LOC E-LOC S-LOC".split(),
    },
]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("source", SCHEMES)
@pytest.mark.parametrize("target", SCHEMES)
def test_convert_between_every_pair_of_schemes(spelling, source, target):
    assert convert_tags(spelling[source], source, target) == spelling[target]
    validate_tags(spelling[source], source)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_round_trips(spelling):
    for path in (["iob1", "iob2", "bioes", "iob1"], ["iob1", "bioes", "iob2", "iob1"]):
        tags = spelling[path[0]]
        for source, target in itertools.pairwise(path):
            tags = convert_tags(tags, source, target)
        assert tags == spelling["iob1"]


def test_ill_formed_input_converts_as_conlleval_reads_it():
    assert convert_tags(["O", "I-PER", "I-LOC"], "iob2", "iob2") == ["O", "B-PER", "B-LOC"]
    assert convert_tags(["B-PER", "I-PER", "O"], "bioes", "bioes") == ["B-PER", "E-PER", "O"]
    assert convert_tags(["B-PER"], "iob1", "iob1") == ["I-PER"]


def test_conversion_keeps_chunks_of_random_sequences():
    rng = random.Random(0)
    tags_of = {"iob1": ["O", "B-A", "I-A", "B-B", "I-B"]}
    tags_of["iob2"] = tags_of["iob1"]
    tags_of["bioes"] = tags_of["iob1"] + ["E-A", "S-A", "E-B", "S-B"]
    for _ in range(300):
        source, target = rng.choice(SCHEMES), rng.choice(SCHEMES)
        tags = [rng.choice(tags_of[source]) for _ in range(rng.randint(0, 9))]
        converted = convert_tags(tags, source, target)
        assert extract_chunks(converted) == extract_chunks(tags)
        validate_tags(converted, target)
        assert convert_tags(converted, target, target) == converted


def test_scheme_errors():
    with pytest.raises(
        ValueError, match="unknown tag scheme 'bio'; expected one of iob1, iob2, bioes"
    ):
        convert_tags(["O"], "bio", "iob2")
    with pytest.raises(ValueError, match="unknown tag scheme 'BIOES'"):
        convert_tags(["O"], "iob2", "BIOES")
    with pytest.raises(
        ValueError, match="word 2: 'E-PER' does not belong to scheme iob2, which uses O, B-, I-"
    ):
        convert_tags(["B-PER", "E-PER"], "iob2", "bioes")
    with pytest.raises(ValueError, match="word 1: unknown tag 'PER'"):
        convert_tags(["PER"], "iob2", "bioes")


@pytest.mark.parametrize(
    "tags, scheme, message",
    [
        (
            ["O", "I-PER"],
            "iob2",
            "word 2: 'I-PER' is not well-formed iob2 here; iob2 writes 'B-PER'",
        ),
        (["B-PER"], "iob1", "word 1: 'B-PER' is not well-formed iob1 here; iob1 writes 'I-PER'"),
        (
            ["B-PER", "I-PER"],
            "bioes",
            "word 2: 'I-PER' is not well-formed bioes here; bioes writes 'E-PER'",
        ),
        (
            ["B-PER", "I-LOC"],
            "iob2",
            "word 2: 'I-LOC' is not well-formed iob2 here; iob2 writes 'B-LOC'",
        ),
    ],
)
def test_validate_tags_names_the_first_bad_word(tags, scheme, message):
    with pytest.raises(ValueError) as caught:
        validate_tags(tags, scheme)
    assert str(caught.value) == message


def test_chunks_to_tags_rejects_overlaps():
    assert chunks_to_tags([("LOC", 2, 3), ("PER", 0, 2)], 3, "iob2") == ["B-PER", "I-PER", "B-LOC"]
    with pytest.raises(ValueError, match="overlaps another or leaves 0..3"):
        chunks_to_tags([("PER", 0, 2), ("LOC", 1, 3)], 3, "iob2")
    with pytest.raises(ValueError, match="leaves 0..3"):
        chunks_to_tags([("PER", 2, 4)], 3, "iob2")
