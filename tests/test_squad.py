"""Tests for bertkit_tasks.span_qa.squad: SQuAD v1.1 / v2.0 JSON and JSON lines readers."""

import json

import pytest

from bertkit.errors import UserError
from bertkit_tasks.span_qa.squad import PlacementReport, QAExample, read_squad

CONTEXT = "Ada Lovelace wrote the first program in 1843."  # "1843" is at 40


def squad_file(tmp_path, qas, name="train.json", version="v2.0"):
    document = {
        "version": version,
        "data": [{"title": "Ada", "paragraphs": [{"context": CONTEXT, "qas": qas}]}],
    }
    path = tmp_path / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def lines_file(tmp_path, records, name="dev.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_error(path):
    with pytest.raises(UserError) as error:
        read_squad(path)
    return str(error.value)


def answer(text, start):
    return {"text": text, "answer_start": start}


def record(id_, texts, starts, context=CONTEXT):
    answers = {"text": texts, "answer_start": starts}
    return {"id": id_, "question": "When?", "context": context, "answers": answers}


def test_reads_squad_v1_with_several_gold_answers(tmp_path):
    qas = [
        {
            "id": "q1",
            "question": "Who?",
            "answers": [answer("Ada Lovelace", 0), answer("Lovelace", 4)],
        }
    ]
    examples, skipped = read_squad(squad_file(tmp_path, qas, version="1.1"))
    assert examples == [
        QAExample("q1", "Who?", CONTEXT, ("Ada Lovelace", "Lovelace"), (0, 4), False)
    ]
    assert skipped == PlacementReport() and not skipped


def test_reads_squad_v2_impossible_question_and_ignores_plausible_answers(tmp_path):
    qas = [
        {"id": "q1", "question": "When?", "answers": [answer("1843", 40)], "is_impossible": False},
        {
            "id": "q2",
            "question": "Who ran?",
            "answers": [],
            "is_impossible": True,
            "plausible_answers": [answer("Ada", 0)],
        },
    ]
    examples, _ = read_squad(squad_file(tmp_path, qas))
    assert [(e.id, e.answers, e.answer_starts, e.is_impossible) for e in examples] == [
        ("q1", ("1843",), (40,), False),
        ("q2", (), (), True),
    ]


def test_reads_json_lines_with_unanswerable_as_empty_lists(tmp_path):
    path = lines_file(tmp_path, [record("a", ["1843"], [40]), record("b", [], [])])
    examples, skipped = read_squad(path)
    assert [(e.id, e.answers, e.is_impossible) for e in examples] == [
        ("a", ("1843",), False),
        ("b", (), True),
    ]
    assert not skipped


def test_json_lines_in_a_json_file_are_recognized_by_content(tmp_path):
    records = [record("a", ["1843"], [40]), record("b", ["Ada"], [0])]
    examples, _ = read_squad(lines_file(tmp_path, records, name="dev.json"))
    assert [e.id for e in examples] == ["a", "b"]


def test_json_lines_split_only_at_newlines(tmp_path):
    context = "Ada\u2028Lovelace\r"  # Unicode line separators stay inside the string
    path = tmp_path / "dev.jsonl"
    line = json.dumps(record("a", ["Lovelace"], [4], context=context), ensure_ascii=False)
    path.write_text(line + "\r\n\n", encoding="utf-8", newline="")
    examples, _ = read_squad(path)
    assert examples[0].context == context


def test_misaligned_answers_are_re_placed_or_kept_for_evaluation_only(tmp_path):
    qas = [
        {"id": "good", "question": "Who?", "answers": [answer("Ada", 0)]},
        {"id": "one_bad", "question": "When?", "answers": [answer("1843", 41), answer("1843", 40)]},
        {"id": "all_bad", "question": "Who?", "answers": [answer("Adam", 1), answer("ada", 0)]},
    ]
    examples, placement = read_squad(squad_file(tmp_path, qas, version="1.1"))
    assert [(e.id, e.answers, e.answer_starts) for e in examples] == [
        ("good", ("Ada",), (0,)),
        ("one_bad", ("1843", "1843"), (40, 40)),  # 41 re-placed at the occurrence at 40
        ("all_bad", ("Adam", "ada"), (-1, -1)),  # neither text is in the context
    ]
    assert placement == PlacementReport(
        replaced=1, unplaced=2, untrainable=1, first_ids=("one_bad", "all_bad")
    )
    assert str(placement) == (
        "3 answers not at their answer_start: 1 re-placed at the nearest occurrence of their "
        "text, 2 not in the context (evaluated, not trained on); 1 questions not trained on; "
        "first: 'one_bad', 'all_bad'"
    )


def test_misaligned_json_lines_answers_keep_their_questions(tmp_path):
    records = [record(f"q{i}", ["1843"], [0]) for i in range(7)] + [record("ok", [], [])]
    records += [record("gone", ["1066"], [40])]
    examples, placement = read_squad(lines_file(tmp_path, records))
    assert [e.id for e in examples] == [*(f"q{i}" for i in range(7)), "ok", "gone"]
    assert [e.answer_starts for e in examples[:7]] == [(40,)] * 7
    assert not examples[-1].is_impossible and examples[-1].answer_starts == (-1,)
    assert (placement.replaced, placement.unplaced, placement.untrainable) == (7, 1, 1)
    assert placement.first_ids == ("q0", "q1", "q2", "q3", "q4")  # the first five only


def test_answer_placed_at_the_occurrence_nearest_its_answer_start(tmp_path):
    context = "ab ab ab"
    records = [record(str(i), ["ab"], [start], context) for i, start in enumerate((1, 5, 8))]
    examples, placement = read_squad(lines_file(tmp_path, records))
    assert [e.answer_starts for e in examples] == [(0,), (6,), (6,)]  # 1 is nearer 0 than 3
    assert placement.replaced == 3


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    assert read_error(path) == f"{path}: file not found"


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"data": [\n  {"paragraphs": []},\n  oops\n]}', encoding="utf-8")
    assert read_error(path) == f"{path}:3: invalid JSON: Expecting value"


def test_bad_json_line_names_the_line(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps(record("a", [], [])) + '\n{"id": "b",\n', encoding="utf-8")
    assert (
        read_error(path)
        == f"{path}:2: invalid JSON: Expecting property name enclosed in double quotes"
    )


def test_missing_squad_key_names_the_question_id(tmp_path):
    path = squad_file(tmp_path, [{"id": "q9", "answers": []}])
    assert read_error(path) == f"{path}: question 'q9': missing key 'question'"


def test_missing_squad_id_names_the_position(tmp_path):
    path = squad_file(tmp_path, [{"question": "Who?", "answers": []}])
    assert read_error(path) == f"{path}: data[0].paragraphs[0].qas[0]: missing key 'id'"


def test_missing_json_lines_key_names_the_line(tmp_path):
    broken = record("b", [], [])
    del broken["answers"]["answer_start"]
    path = lines_file(tmp_path, [record("a", [], []), broken])
    assert read_error(path) == f"{path}:2: missing key 'answers.answer_start'"


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([record("a", [], []), record("a", [], [])], "2: duplicate question id 'a'"),
        ([record("a", ["Ada", "x"], [0])], "1: 2 answer texts but 1 answer_start values"),
        ([record("a", ["Ada"], ["0"])], "1: answers.answer_start: expected integers"),
        (
            [{**record("a", ["Ada"], [0]), "is_impossible": True}],
            "1: is_impossible is true but answers are given",
        ),
        ([{**record("a", [], []), "context": 7}], "1: context: expected a string"),
        ([[1, 2]], "1: expected a JSON object"),
    ],
)
def test_json_lines_errors(tmp_path, records, message):
    path = lines_file(tmp_path, records)
    assert read_error(path) == f"{path}:{message}"


def test_squad_answerable_question_without_answers_is_an_error(tmp_path):
    path = squad_file(
        tmp_path, [{"id": "q1", "question": "?", "answers": [], "is_impossible": False}]
    )
    assert (
        read_error(path)
        == f"{path}: question 'q1': is_impossible is false but no answers are given"
    )


def test_json_that_is_neither_format(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"articles": []}', encoding="utf-8")
    assert read_error(path) == (
        f"{path}: expected a SQuAD object with a 'data' list, or one JSON object per line"
    )
