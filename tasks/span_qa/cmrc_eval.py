"""The CMRC 2018 metric, as the official `cmrc2018_evaluate.py` computes it, and the
`auto` choice between it and SQuAD's.

SQuAD's F1 counts whitespace tokens, so on unspaced Chinese an answer is one token and
F1 is all or nothing. The CMRC 2018 script (github.com/ymcui/cmrc2018,
`squad-style-data/cmrc2018_evaluate.py`) instead:

* lowercases and strips both texts; `mixed_segmentation` makes each CJK character
  (U+4E00-U+9FA5) and each of its listed punctuation characters one token, and splits
  the runs between them with `nltk.word_tokenize` (ported in
  `bertkit_tasks.span_qa.treebank_words`, one line at a time);
* EM: the texts are equal once its punctuation characters are removed
  (`remove_punctuation`; spaces inside stay);
* F1: over the tokens of both texts with the punctuation removed, precision and recall
  of their longest common run of tokens (`find_lcs`, contiguous), 0 when there is none;
* a question scores the max over its gold answers.

Its empty-string rules are kept: an empty prediction scores F1 0 (and EM 1 only against a
gold answer that is empty once punctuation is removed). The script has no unanswerable
questions; for SQuAD v2.0 data bertkit gives one the rule of SQuAD v2.0, 1 when the
prediction is empty once punctuation is removed, else 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertkit_tasks.span_qa.treebank_words import word_tokenize

# The script's `sp_char` list. It also lists "……", two characters, which a one-character
# comparison never matches, so "…" stays a character of its run, as in the script.
PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
# Share of CJK characters among a context's non-space characters above which `auto`
# reads the data as Chinese.
CJK_SHARE = 0.3


def _is_script_cjk(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fa5"  # the script's [\u4e00-\u9fa5]


def mixed_segmentation(text: str, remove_punctuation: bool = False) -> list[str]:
    """The script's tokens: one a CJK character or punctuation mark, NLTK words between.

    Example:
        >>> mixed_segmentation("2018年的BERT-base模型")
        ['2018', '年', '的', 'bert', '-', 'base', '模', '型']
        >>> mixed_segmentation("2018年的BERT-base模型", remove_punctuation=True)
        ['2018', '年', '的', 'bertbase', '模', '型']
    """
    tokens, run = [], ""
    for char in text.lower().strip():
        if remove_punctuation and char in PUNCTUATION:
            continue  # dropped from its run, which goes on: "a-b" is one word "ab"
        if _is_script_cjk(char) or char in PUNCTUATION:
            if run:
                tokens += word_tokenize(run)
                run = ""
            tokens.append(char)
        else:
            run += char
    return tokens + word_tokenize(run) if run else tokens


def remove_punctuation(text: str) -> str:
    """Lowercased, stripped, without the script's punctuation characters.

    Example:
        >>> remove_punctuation(" 《红楼梦》，Vol. 1 ")
        '红楼梦vol. 1'
    """
    return "".join(char for char in text.lower().strip() if char not in PUNCTUATION)


def longest_common_run(first: Sequence[str], second: Sequence[str]) -> int:
    """Length of the longest run of tokens found in both sequences (the script's `find_lcs`).

    Example:
        >>> longest_common_run(list("北京大学"), list("在北京大"))
        3
    """
    best, previous = 0, [0] * (len(second) + 1)
    for token in first:
        current = [0] * (len(second) + 1)
        for j, other in enumerate(second):
            if token == other:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def cmrc_exact_match(prediction: str, gold: str) -> int:
    """1 if the texts are equal without punctuation (case and outer spaces ignored), else 0.

    Example:
        >>> cmrc_exact_match("《红楼梦》", "红楼梦"), cmrc_exact_match("红楼", "红楼梦")
        (1, 0)
    """
    return int(remove_punctuation(prediction) == remove_punctuation(gold))


def cmrc_f1(prediction: str, gold: str) -> float:
    """F1 of the longest common run of tokens (punctuation removed); 0 without one.

    Example:
        >>> round(cmrc_f1("北京大", "北京大学"), 4)  # p = 3/3, r = 3/4
        0.8571
        >>> cmrc_f1("", ""), cmrc_f1("Beijing", "beijing")
        (0.0, 1.0)
    """
    gold_tokens = mixed_segmentation(gold, remove_punctuation=True)
    prediction_tokens = mixed_segmentation(prediction, remove_punctuation=True)
    common = longest_common_run(gold_tokens, prediction_tokens)
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def cmrc_scores(prediction: str, golds: Sequence[str]) -> tuple[int, float]:
    """(EM, F1) of one question: the max over its gold answers; with none (unanswerable,
    SQuAD v2.0) 1 for a prediction empty once punctuation is removed, else 0.

    Example:
        >>> cmrc_scores("北京", ["北京大学", "北京"]), cmrc_scores("", [])
        ((1, 1.0), (1, 1.0))
    """
    if not golds:
        empty = int(not remove_punctuation(prediction))
        return empty, float(empty)
    exact = max(cmrc_exact_match(prediction, gold) for gold in golds)
    return exact, max(cmrc_f1(prediction, gold) for gold in golds)


def _is_cjk(char: str) -> bool:
    # Unified ideographs, extension A and the compatibility block: Traditional Chinese too.
    return (
        "\u4e00" <= char <= "\u9fff" or "\u3400" <= char <= "\u4dbf" or "\uf900" <= char <= "\ufaff"
    )


def cjk_share(contexts: Sequence[str]) -> float:
    """Share of CJK ideographs among the non-space characters of the distinct contexts.

    Example:
        >>> cjk_share(["北京大学", "Oslo"])
        0.5
    """
    cjk = total = 0
    for context in dict.fromkeys(contexts):
        characters = "".join(context.split())
        total += len(characters)
        cjk += sum(map(_is_cjk, characters))
    return cjk / total if total else 0.0


def choose_metric(metric: str, contexts: Sequence[str]) -> tuple[str, str]:
    """The metric to score with (`squad` or `cmrc2018`) and a line saying why.

    `auto` picks `cmrc2018` when over 30% of the evaluation contexts' non-space characters
    are CJK ideographs, else `squad`.

    Example:
        >>> metric, line = choose_metric("auto", ["北京是中国的首都。"])
        >>> print(line)
        span_qa metric: cmrc2018 (auto: the evaluation contexts are 89% CJK characters)
        >>> choose_metric("squad", ["北京"])[1]
        'span_qa metric: squad (task.metric)'
    """
    if metric != "auto":
        return metric, f"span_qa metric: {metric} (task.metric)"
    share = cjk_share(contexts)
    chosen = "cmrc2018" if share > CJK_SHARE else "squad"
    reason = f"the evaluation contexts are {share:.0%} CJK characters"
    return chosen, f"span_qa metric: {chosen} (auto: {reason})"
