"""Bench metrics: answer normalisation and scores (prose and code), evidence recall on hand-built spans, bootstrap
intervals."""

import pytest

from latentwire.bench.episode import Episode, span_token_positions
from latentwire.bench.metrics import answer_scores, bootstrap_ci, evidence_recall, normalize
from latentwire.errors import TaskFormatError
from latentwire.models import tiny_tokenizer


def test_squad_normalisation_and_scores():
    assert normalize("The  Code, is: 7341!") == "code is 7341"
    s = answer_scores("The code is 7341.", ["7341"])
    assert s["accuracy"] == 1.0 and s["em"] == 0.0 and 0 < s["f1"] < 1
    assert answer_scores("7341", ["7341"])["em"] == 1.0
    assert answer_scores("73410", ["7341"])["accuracy"] == 0.0  # whole words only
    multi = {"city": ["Lisbon"], "lead": ["Ana Silva"]}
    assert answer_scores("Ana Silva, in Lisbon", multi)["strict"] == 1.0
    part = answer_scores("in Lisbon", multi)
    assert part["accuracy"] == 0.5 and part["strict"] == 0.0


def test_evidence_recall_exact_on_hand_built_spans():
    tok = tiny_tokenizer()  # byte-level: one token per character here
    text = "alpha beta gamma"
    gold = span_token_positions(text, [(6, 10)], tok)
    assert gold == [6, 7, 8, 9]  # "beta"
    assert evidence_recall(gold, range(6, 8)) == 0.5
    assert evidence_recall(gold, range(16)) == 1.0
    assert evidence_recall(gold, []) == 0.0
    assert evidence_recall([], [1, 2]) is None


def test_bootstrap_is_deterministic_and_brackets_the_mean():
    xs = [0, 1, 1, 0, 1, 1, 1, 0]
    m, lo, hi = bootstrap_ci(xs)
    assert (m, lo, hi) == bootstrap_ci(xs) and lo <= m <= hi and m == pytest.approx(0.625)


def test_an_alias_that_normalises_to_nothing_never_scores():
    for prediction in ("", '""', "the"):
        s = answer_scores(prediction, ['""', "the"])
        assert s == {"em": 0.0, "f1": 0.0, "accuracy": 0.0, "strict": 0.0}, prediction
    assert answer_scores("It is 7341", ['""', "7341"])["accuracy"] == 1.0  # the other aliases still count


def test_text_normalisation_splits_hyphens_drops_unicode_punctuation_and_keeps_decimal_points():
    assert normalize("Hip-hop – “Cello”, 6.0 million.") == "hip hop cello 6.0 million"
    assert answer_scores("She dances hip-hop.", ["hip hop"])["accuracy"] == 1.0
    assert answer_scores("She plays the “cello”.", ["cello"])["accuracy"] == 1.0
    assert answer_scores("60 million euros", ["6.0 million euros"])["accuracy"] == 0.0  # was a match: "60"
    assert normalize("It is 3.5.") == "it is 3.5" and normalize("3\x005") != "3.5"  # only a real point survives
    assert answer_scores("It is 35.", ["3.5"])["accuracy"] == 0.0 and answer_scores("3.5", ["3.5"])["em"] == 1.0
    assert answer_scores("-5", ["5"])["em"] == 0.0 and answer_scores("It fell to −5 degrees.", ["-5"])["accuracy"] == 1
    assert normalize("1-2 and n-1") == "1 2 and n 1"  # a hyphen between numbers or after a word still splits
    assert normalize("cafe\u0301 Straße") == normalize("café STRASSE") == "café strasse"  # NFC, case-folded
    assert normalize("\x00-\x005") == "-5"  # the sign's stand-in cannot come from the text itself


def test_code_answers_keep_signs_operators_and_string_literals():
    def acc(prediction, aliases):
        return answer_scores(prediction, aliases, "code")["accuracy"]

    assert acc("It returns `-1`.", ["-1"]) == 1.0 and acc("It returns `1`.", ["-1"]) == 0.0
    assert acc("returns -10", ["-1"]) == 0.0  # a number glued to more digits is another number
    assert acc("`(self // other, self % other)`", ["(self//other, self%other)"]) == 1.0
    assert acc("`(self / other, self * other)`", ["(self//other, self%other)"]) == 0.0
    assert acc("S_IFMT(mode) != S_IFLNK", ["S_IFMT(mode) == S_IFLNK"]) == 0.0
    assert acc("The base class is `calendar.Calendar`.", ["Calendar"]) == 1.0
    assert acc("It is `Calendars`.", ["Calendar"]) == 0.0 and acc("`true`", ["True"]) == 0.0
    assert acc('The default is `""`.', ['""']) == 1.0 and acc('The default is `" "`.', ['""']) == 0.0
    assert acc("It is `{}`.", ["{}"]) == 1.0
    assert answer_scores("It is `{}`.", ["{}"])["accuracy"] == 0.0  # as text, `{}` normalises to nothing
    s = answer_scores("`{}`.", ["{}"], "code")
    assert s["em"] == 1.0 and s["f1"] == 1.0  # wrapping backticks and a final stop are not part of the value
    # a number or operator standing alone: not a sign, a decimal part or a longer operator away
    for prediction, gold in [("The answer is -1.", "1"), ("`1.0`", "1"), ("0.1", "1"), ("9.00000000000000004", "9"),
                             ("The default is 1.0", "0"), ("6.5", "6"), ("a // b", "/"), ("a == b", "="),
                             ("x <= y", "<"), ("returns n - 1", "-1"), ("n-1", "-1"), ("f(x)-1", "-1")]:
        assert acc(prediction, [gold]) == 0.0, (prediction, gold)
    for prediction, gold in [("It is 1.", "1"), ("x = -1", "-1"), ("(-1)", "-1"), ("returns -1", "-1"),
                             ("is `''`", '""'), ("f(a,'b')", "f(a, 'b')"),
                             ("(sep or ' ').join(x)", "(sep or ' ').join(x)")]:
        assert acc(prediction, [gold]) == 1.0, (prediction, gold)  # the same literal, the same tokens
    assert acc("(sep or '').join(x)", ["(sep or ' ').join(x)"]) == 0.0  # a literal's spaces are its value
    with pytest.raises(ValueError, match="match: want one of text, code"):
        answer_scores("x", ["x"], "regex")


def test_episodes_pick_their_answer_match_and_refuse_answers_that_could_never_score():
    def ep(task="facts", answers=("7341",), meta=None):
        return Episode("e", task, "fanin", "Q?", list(answers), ("doc",), (), meta or {})

    assert ep().answer_match == "text" and ep("code", ["{}"]).answer_match == "code"
    assert ep(meta={"answer_match": "code"}, answers=["-1"]).answer_match == "code"
    with pytest.raises(TaskFormatError, match="meta.answer_match: want one of text, code"):
        ep(meta={"answer_match": "exact"})
    with pytest.raises(TaskFormatError, match="every alias normalises to nothing"):
        ep(answers=['""', "the"])  # as text nothing is left of either alias
    with pytest.raises(TaskFormatError, match=r"answers\['city'\]: every alias"):
        Episode("e", "facts", "fanin", "Q?", {"city": ["."], "lead": ["Ana"]}, ("doc",))
    assert ep(answers=['""', "7341"]).answers == ['""', "7341"]  # one scorable alias is enough


def test_bootstrap_intervals_have_the_normal_width_on_a_large_sample():
    """Not only lo ≤ mean ≤ hi: on 400 fair coin flips the 95% interval is ≈ ±1.96·√(p(1−p)/n) = ±0.049."""
    from latentwire.bench.metrics import paired_bootstrap_diff

    xs = [1.0, 0.0] * 200
    m, lo, hi = bootstrap_ci(xs)
    assert m == 0.5 and (hi - lo) == pytest.approx(2 * 1.96 * (0.25 / 400) ** 0.5, rel=0.15)
    assert lo < 0.5 < hi and (0.5 - lo) == pytest.approx(hi - 0.5, rel=0.2)
    d, dlo, dhi = paired_bootstrap_diff(xs, [0.0] * 400)  # b constant: the difference's spread is a's
    assert d == 0.5 and (dhi - dlo) == pytest.approx(hi - lo, rel=0.05)


def test_stratified_bootstrap():
    from latentwire.bench.metrics import stratified_bootstrap_ci

    xs = [1, 0, 1, 1, 0, 1, 0, 0, 1]
    assert stratified_bootstrap_ci([xs]) == bootstrap_ci(xs)  # one stratum: the plain bootstrap, same draws
    # cells weigh equally whatever their sizes (macro, not micro), and constant cells have no spread
    assert stratified_bootstrap_ci([[1, 1], [0] * 8]) == (0.5, 0.5, 0.5)
    m, lo, hi = stratified_bootstrap_ci([[1, 0, 1, 0], [1, 1, 1, 1]], seed=3)
    assert m == 0.75 and 0.5 <= lo <= m <= hi <= 1.0
    assert stratified_bootstrap_ci([[], [1.0]]) == (1.0, 1.0, 1.0)  # empty cells are left out
