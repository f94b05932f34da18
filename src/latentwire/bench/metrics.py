"""Answer and evidence metrics.

Text answers use SQuAD normalisation (lower case, no punctuation, no articles, single spaces) with five
fixes: hyphens and dashes split words ("hip-hop" = "hip hop"), Unicode punctuation goes as ASCII does
(“cello” = cello), a point between digits stays (6.0 ≠ 60), a minus sign before a number stays (-5 ≠ 5; a
hyphen between numbers still splits them: "1-2" = "1 2"), and text is NFC-normalised and case-folded (a
composed "café" = a decomposed one, "Straße" = "STRASSE"). Small models answer in sentences ("The code
is 7341."), so besides EM/F1 we report `accuracy`: a gold alias occurs in the prediction as a whole-word
sequence after normalisation. `strict` requires every part of a multi-part answer to be correct (equals
`accuracy` for single-part answers).

Code answers (`match="code"`: the `code` task's values, operators and literals) keep case and punctuation,
where SQuAD normalisation would make `-1` equal `1` and `a // b` equal `a / b`: a gold value matches as its
tokens in order, whitespace free between them (`_code_pattern`), standing alone (`_edges_ok`: `1` is not
found in `-1`, `1.0` or `10`, `/` not in `//`), a string literal in either quote style.

Multiple-choice answers (`match="choice"`: gold aliases [letter, that choice's text], e.g. LongBench v2) score
the letter the prediction chooses (`chosen_letter`: "The answer is (B)", "B.", "(B)"), never a letter that
merely occurs ("vitamin D", "not B"); a prediction that names no letter is matched on the choice's text. SQuAD
normalisation would drop the letter A as an article and find B anywhere.
"""
from __future__ import annotations

import math
import random
import re
import statistics
import string
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

MATCHES = ("text", "code", "choice")  # how a prediction is matched against gold aliases
# The letter a multiple-choice answer chooses: after "answer/option/choice (is)", in brackets, or standing alone at the
# start of a line ("B.", "**B**"); the first such mention wins.
_CHOICE = re.compile(r"(?i:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*\(?([A-J])\)?(?![\w'])"
                     r"|\(([A-J])\)"
                     r"|^\W*?([A-J])(?:[.):\]*]|\s*$)", re.M)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DASHES = re.compile(r"[-\u2010-\u2015\u2212]")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_SIGN = re.compile(r"(?<![\w.])[-\u2212](?=\d)")  # a minus sign: before a number, not after a word or number
_SIGN_MARK = "\x00"  # stands in for a kept sign while punctuation goes


def _drop(c: str) -> bool:
    return c in string.punctuation or (c > "\x7f" and unicodedata.category(c).startswith("P"))


def normalize(text: str) -> str:
    text = _SIGN.sub(_SIGN_MARK, unicodedata.normalize("NFC", text.replace(_SIGN_MARK, "")).casefold())
    pieces = _DECIMAL.split(_DASHES.sub(" ", text))  # a point between digits survives the strip
    t = ".".join("".join(c for c in piece if not _drop(c)) for piece in pieces)
    return " ".join(_ARTICLES.sub(" ", t).split()).replace(_SIGN_MARK, "-")


# Code tokens: identifiers and numbers, string literals whole (their spaces are their value), any other character.
_CODE_TOKEN = re.compile(r"\w+|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|\S")
_OPS = frozenset("=<>!/*%&|^+-~@")  # a gold operator must not be part of a longer one (`/` in `//`)


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _literal(tok: str) -> str:
    """A string literal matches in either quote style when it needs no escape (`''` = `""`)."""
    body = tok[1:-1]
    if "\\" in body or "'" in body or '"' in body:
        return re.escape(tok)
    return f"(?:'{re.escape(body)}'|\"{re.escape(body)}\")"


def _code_pattern(gold: str) -> str:
    """A regex for `gold` as code: its tokens in order, whitespace free between them except that two word
    tokens need some (`a // b` = `a//b`, `f(a,'b')` = `f(a, 'b')`), and none inside a signed number (`-1`)."""
    toks = _CODE_TOKEN.findall(gold)
    out = []
    for k, tok in enumerate(toks):
        if k:
            prev = toks[k - 1]
            signed = k == 1 and prev in "+-" and tok[0].isdigit()
            out.append("" if signed else r"\s+" if _word(prev[-1]) and _word(tok[0]) else r"\s*")
        out.append(_literal(tok) if tok[0] in "'\"" and len(tok) > 1 else re.escape(tok))
    return "".join(out)


def _edges_ok(text: str, i: int, j: int, gold: str) -> bool:
    """Whether text[i:j], a match of `gold`, stands alone: no word character glued to a word end, no sign or
    decimal part glued to a number (`1` is not in `-1`, `1.0` or `0.1`), no operator glued to an operator
    (`/` is not in `//`), and a signed number not the right side of a subtraction (`n-1`; `n - 1` does not
    match at all: a signed number's sign touches its digits)."""
    before, after = text[i - 1] if i else "", text[j] if j < len(text) else ""
    g0, g1 = gold[0], gold[-1]
    if _word(g0) and before and (_word(before) or (g0.isdigit() and (before in "+-" or (
            before == "." and i > 1 and text[i - 2].isdigit())))):
        return False
    if g0 in "+-" and gold[1:2].isdigit():  # a subtraction's right side (`n-1`, `f(x)-1`) is not a signed number
        if before and (_word(before) or before in ")]}"):
            return False
    elif g0 in _OPS and before in _OPS:
        return False
    if _word(g1) and after and (_word(after) or (g1.isdigit() and after == "." and text[j + 1:j + 2].isdigit())):
        return False
    return not (g1 in _OPS and after in _OPS)


def _code_found(text: str, gold: str, whole: bool = False) -> bool:
    """Whether `gold` occurs in `text` as code (`_code_pattern`, `_edges_ok`); `whole`: as all of it."""
    pattern = re.compile(_code_pattern(gold))
    if whole:
        return pattern.fullmatch(text) is not None
    return any(_edges_ok(text, m.start(), m.end(), gold) for m in _overlapping(pattern, text))


def _overlapping(pattern: re.Pattern, text: str):
    start = 0
    while (m := pattern.search(text, start)) is not None:
        yield m
        start = m.start() + 1


def code_normalize(text: str) -> str:
    """A code answer's whitespace as one space each run (case and punctuation stay)."""
    return " ".join(text.split())


def _code_tokens(text: str) -> list[str]:
    return [t for t in _CODE_TOKEN.findall(text) if t != "`"]  # backticks quote code in prose; not part of it


def _bare(prediction: str) -> str:
    """A code prediction without its wrapping backticks and final full stop (prose around a value)."""
    return prediction.strip().removesuffix(".").strip().strip("`").strip()


def chosen_letter(prediction: str) -> str | None:
    """The letter (A-J) a multiple-choice prediction chooses, or None when it names none (see `_CHOICE`)."""
    m = _CHOICE.search(prediction)
    return None if m is None else next(g for g in m.groups() if g)


def _choice_scores(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """[letter, choice text]: the chosen letter must be the gold one; with no letter, the choice's text."""
    letter = chosen_letter(prediction)
    if letter is not None:
        hit = float(letter == answers[0])
    else:
        hit = contains(prediction, answers[1:]) if len(answers) > 1 else 0.0
    return {"em": hit, "f1": hit, "accuracy": hit, "strict": hit}


def scorable(alias: str, match: str = "text") -> bool:
    """Whether an alias can ever be matched: one that normalises to nothing (only punctuation or articles as
    text) never scores; a choice's letter always can."""
    if match == "choice":
        return bool(alias.strip())
    return bool(code_normalize(alias) if match == "code" else normalize(alias))


def exact_match(prediction: str, aliases: Sequence[str], match: str = "text") -> float:
    """1.0 if the normalised prediction equals a normalised alias. An alias that normalises to nothing (only
    punctuation or articles) cannot be matched, as in `contains`: an empty answer never scores. Code: the
    prediction's wrapping backticks and a final full stop are dropped first (also for F1)."""
    if match == "code":
        bare = code_normalize(_bare(prediction))
        return float(any(scorable(a, "code") and _code_found(bare, code_normalize(a), whole=True) for a in aliases))
    p = normalize(prediction)
    return float(any(normalize(a) and p == normalize(a) for a in aliases))


def f1(prediction: str, aliases: Sequence[str], match: str = "text") -> float:
    """Best token F1 over the aliases (an alias that normalises to nothing scores 0, as in `exact_match`);
    code tokens are identifiers, numbers and single punctuation characters."""
    def one(gold: str) -> float:
        if match == "code":
            pt, gt = _code_tokens(_bare(prediction)), _code_tokens(gold)
        else:
            pt, gt = normalize(prediction).split(), normalize(gold).split()
        common = sum((Counter(pt) & Counter(gt)).values())
        if not pt or not gt or common == 0:
            return 0.0
        precision, recall = common / len(pt), common / len(gt)
        return 2 * precision * recall / (precision + recall)

    return max((one(a) for a in aliases), default=0.0)


def contains(prediction: str, aliases: Sequence[str], match: str = "text") -> float:
    """1.0 if some normalised alias occurs in the normalised prediction on word boundaries."""
    if match == "code":
        text = code_normalize(prediction)
        return float(any(scorable(a, "code") and _code_found(text, code_normalize(a)) for a in aliases))
    p = f" {normalize(prediction)} "
    return float(any(normalize(a) and f" {normalize(a)} " in p for a in aliases))


def answer_scores(prediction: str, answers: list | dict, match: str = "text") -> dict[str, float | None]:
    """EM, F1, accuracy and strict accuracy of one prediction against list or multi-part gold answers
    (EM is None for multi-part answers: a sentence cannot equal several parts at once). `match`: "text"
    (normalised words) or "code" (case, operators and literals kept)."""
    if match not in MATCHES:
        raise ValueError(f"match: want one of {', '.join(MATCHES)}, got {match!r}")
    if match == "choice":
        if isinstance(answers, dict) or not answers or not re.fullmatch(r"[A-J]", answers[0]):
            raise ValueError(f"match='choice' wants answers [letter A-J, choice text], got {answers!r}")
        return _choice_scores(prediction, answers)
    if isinstance(answers, dict):  # multi-part: each part scored on the whole prediction, averaged
        parts = [contains(prediction, aliases, match) for aliases in answers.values()]
        return {"em": None, "f1": sum(f1(prediction, a, match) for a in answers.values()) / len(answers),
                "accuracy": sum(parts) / len(parts), "strict": float(all(parts))}
    acc = contains(prediction, answers, match)
    return {"em": exact_match(prediction, answers, match), "f1": f1(prediction, answers, match), "accuracy": acc,
            "strict": acc}


def evidence_recall(gold_positions: Iterable[int], kept_positions: Iterable[int]) -> float | None:
    """Gold evidence token positions kept ÷ all gold positions (None when there is no gold evidence)."""
    gold = set(gold_positions)
    if not gold:
        return None
    return len(gold & set(kept_positions)) / len(gold)


def bootstrap_ci(values: Sequence[float], n_resamples: int = 2000, seed: int = 0,
                 level: float = 0.95, clusters: Sequence | None = None) -> tuple[float, float, float]:
    """(mean, low, high) with a percentile bootstrap; deterministic given the seed. `clusters` (one id per value,
    e.g. the set of documents several questions share): whole clusters are resampled and the mean taken over
    their pooled values, so correlated values do not count as independent (the mean itself is unchanged)."""
    xs = [float(v) for v in values]
    if not xs:
        return float("nan"), float("nan"), float("nan")
    mean = sum(xs) / len(xs)
    rng = random.Random(seed)
    if clusters is not None:
        if len(clusters) != len(xs):
            raise ValueError(f"{len(clusters)} cluster ids for {len(xs)} values")
        groups: dict = {}
        for c, x in zip(clusters, xs):
            groups.setdefault(c, []).append(x)
        sums = [(sum(g), len(g)) for g in groups.values()]

        def pooled() -> float:
            picked = rng.choices(sums, k=len(sums))
            return sum(s for s, _ in picked) / sum(n for _, n in picked)

        means = sorted(pooled() for _ in range(n_resamples))
    else:
        means = sorted(sum(rng.choices(xs, k=len(xs))) / len(xs) for _ in range(n_resamples))
    lo = means[int((1 - level) / 2 * n_resamples)]
    hi = means[min(n_resamples - 1, int((1 + level) / 2 * n_resamples))]
    return mean, lo, hi


def bootstrap_median_ci(values: Sequence[float], n_resamples: int = 2000, seed: int = 0,
                        level: float = 0.95, clusters: Sequence | None = None) -> tuple[float, float, float]:
    """(median, low, high) with a percentile bootstrap of the median; deterministic given the seed. `clusters`
    (one id per value, e.g. the set of documents several questions share): whole clusters are resampled and the
    median taken over their pooled values, so correlated values do not count as independent."""
    xs = [float(v) for v in values]
    if not xs:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    if clusters is None:
        meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n_resamples))
    else:
        if len(clusters) != len(xs):
            raise ValueError(f"one cluster per value: {len(clusters)} clusters for {len(xs)} values")
        groups: dict = {}
        for c, x in zip(clusters, xs):
            groups.setdefault(c, []).append(x)
        cells = list(groups.values())
        meds = sorted(statistics.median([x for g in rng.choices(cells, k=len(cells)) for x in g])
                      for _ in range(n_resamples))
    return (statistics.median(xs), meds[int((1 - level) / 2 * n_resamples)],
            meds[min(n_resamples - 1, int((1 + level) / 2 * n_resamples))])


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], n_resamples: int = 2000, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a - b), low, high): episodes resampled with both protocols' scores kept together."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    return bootstrap_ci([float(x) - float(y) for x, y in zip(a, b)], n_resamples, seed, level)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value: of the n pairs where exactly one of a, b is correct, is the split
    between "a only" and "b only" more lopsided than a fair coin would make it? 1.0 when n = 0."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    a_only = sum(bool(x) and not bool(y) for x, y in zip(a, b))
    b_only = sum(bool(y) and not bool(x) for x, y in zip(a, b))
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def sign_flip_exact(a: Sequence[float], b: Sequence[float], max_denominator: int = 1000,
                    max_grid: int = 5_000_000, draws: int = 100_000, seed: int = 0) -> float:
    """Two-sided p of the paired sign-flip (permutation) test of mean(a − b): under "no difference" each
    episode's difference is as likely to have had the other sign, so p = P(|Σ ±dᵢ| ≥ |Σ dᵢ|) over all 2ⁿ sign
    patterns. On 0/1 scores it is McNemar's exact test (the discordant pairs are the ±1 differences); it is the
    test that fits partial credit (a multi-part answer scored 2/3), where McNemar would have to dichotomise.
    Exact, by dynamic programming over the differences on their common grid, when they are fractions with
    denominators ≤ `max_denominator` spanning ≤ `max_grid` steps (every score this library writes: k/m with
    m ≤ 11); otherwise `draws` seeded random sign patterns, p = (1 + as extreme) / (1 + draws)."""
    import numpy as np
    from fractions import Fraction

    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    raw = [float(x) - float(y) for x, y in zip(a, b)]
    exact = [Fraction(float(x)).limit_denominator(max_denominator) - Fraction(float(y)).limit_denominator(
        max_denominator) for x, y in zip(a, b)]
    if all(abs(float(d) - r) <= 1e-9 for d, r in zip(exact, raw)):
        diffs = [d for d in exact if d != 0]
        if not diffs:
            return 1.0
        grid = math.lcm(*(d.denominator for d in diffs))
        steps = [abs(int(d * grid)) for d in diffs]
        total = sum(steps)
        if total <= max_grid:
            observed = abs(sum(int(d * grid) for d in diffs))
            dist = np.zeros(total + 1, dtype=np.float64)  # P(Σ of the steps given a "+" sign = s)
            dist[0] = 1.0
            for x in steps:  # each step joins the "+" set with probability ½
                dist[x:] = dist[x:] / 2 + dist[:-x] / 2 if x else dist[x:]
                dist[:x] /= 2
            # Σ ±dᵢ = 2·(+ set) − total: as extreme as observed where |2s − total| ≥ observed
            s_ = np.arange(total + 1)
            return float(min(1.0, dist[np.abs(2 * s_ - total) >= observed].sum()))
    d = np.array([x for x in raw if x != 0.0], dtype=np.float64)
    if not d.size:
        return 1.0
    observed = abs(d.sum()) - 1e-12 * max(1.0, np.abs(d).sum())  # float slack: the observed pattern counts
    rng, extreme, left = np.random.default_rng(seed), 0, draws
    chunk = max(1, 2**22 // d.size)  # sign matrices of ≤ 32 MB (one chunk for every n below ~40)
    while left:
        signs = rng.choice([-1.0, 1.0], size=(min(chunk, left), d.size))
        extreme += int((np.abs(signs @ d) >= observed).sum())
        left -= signs.shape[0]
    return (1 + extreme) / (1 + draws)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the order given: the i-th smallest p is multiplied by (m − i),
    made non-decreasing along the sorted order and capped at 1. Rejecting where the adjusted p ≤ α keeps the
    chance of any false "difference" among the m verdicts of a table at most α."""
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - rank) * float(ps[i])))
        out[i] = running
    return out


def median_ratio_ci(num: Sequence[float], den: Sequence[float], n_resamples: int = 2000, seed: int = 0,
                    level: float = 0.95, clusters: Sequence | None = None) -> tuple[float, float, float]:
    """Median over episodes of num_i / den_i (e.g. TTEOA of a over TTEOA of b), with a bootstrap CI (over
    `clusters` of episodes where given, as `bootstrap_median_ci`)."""
    if len(num) != len(den):
        raise ValueError(f"paired samples differ in length: {len(num)} vs {len(den)}")
    return bootstrap_median_ci([float(x) / float(y) for x, y in zip(num, den)], n_resamples, seed, level, clusters)


def stratified_bootstrap_ci(strata: Sequence[Sequence[float]], n_resamples: int = 2000, seed: int = 0,
                            level: float = 0.95) -> tuple[float, float, float]:
    """(mean of the strata's means, low, high): each resample redraws every stratum from itself (e.g. the
    episodes of each (model pair, task) cell), so a macro average keeps its cells' weights. One stratum
    gives exactly `bootstrap_ci`. Paired differences: pass per-stratum differences a_i - b_i."""
    cells = [[float(v) for v in s] for s in strata if len(s)]
    if not cells:
        return float("nan"), float("nan"), float("nan")
    macro = sum(sum(c) / len(c) for c in cells) / len(cells)
    rng = random.Random(seed)
    means = sorted(sum(sum(rng.choices(c, k=len(c))) / len(c) for c in cells) / len(cells)
                   for _ in range(n_resamples))
    lo = means[int((1 - level) / 2 * n_resamples)]
    hi = means[min(n_resamples - 1, int((1 + level) / 2 * n_resamples))]
    return macro, lo, hi
