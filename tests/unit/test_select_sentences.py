"""Sentence-unit selection: sentence and line groups, the unit floor, adaptive (mass) budgets, context rows."""
import re

import pytest
import torch

from latentwire.errors import ConfigError, UnknownNameError
from latentwire.message import SEPARATOR
from latentwire.protocols import get_protocol
from latentwire.select import select_rows


# -- sentence / line spans ----------------------------------------------------------------------------
def _rows_of(doc: str, tokens: list[str]) -> list[tuple[int, int]]:
    """Character spans of consecutive pieces that spell `doc` (a stand-in for a tokenizer's offsets)."""
    assert "".join(tokens) == doc
    spans, at = [], 0
    for t in tokens:
        spans.append((at, at + len(t)))
        at += len(t)
    return spans


def test_sentence_groups_end_at_sentences_lines_and_length():
    from latentwire.select import sentence_groups

    doc = "Ada led Orion. Bo led Vega in Oslo.\nBudget: 40k\nEnd"
    pieces = ["Ada", " led", " Orion", ".", " Bo", " led", " Vega", " in", " Oslo", ".", "\n", "Budget", ":", " 40k",
              "\n", "End"]
    per_row = [None] + _rows_of(doc, pieces) + [None, None]  # template rows around the document
    groups = sentence_groups(per_row, doc, max_len=32)
    text = lambda g: "".join(doc[per_row[r][0]:per_row[r][1]] for r in g)  # noqa: E731
    assert [text(g) for g in groups] == ["Ada led Orion.", " Bo led Vega in Oslo.", "Budget: 40k\n", "End"]
    assert all(per_row[r] is not None for g in groups for r in g)  # never outside the document's rows
    short = sentence_groups(per_row, doc, max_len=2)
    assert max(map(len, short)) <= 2 and sum(map(len, short)) == len(pieces) - 1  # all but the lone "\n" row
    assert sentence_groups(per_row, doc, max_len=32) == groups  # deterministic


def test_sentence_groups_leave_out_parts_of_whitespace_alone():
    """Blank lines (code) and trailing spaces form no unit, so they never compete for a budget; a line's own newline
    and indentation stay in its group; a sentence at max_len is not cut because blank lines follow it."""
    from latentwire.select import sentence_groups

    doc = "\n\nimport os\n\n\ndef f():\n    \n    return 1\n  "
    pieces = ["\n", "\n", "import", " os", "\n", "\n", "\n", "def", " f", "():", "\n", "    ", "\n", "    ", "return",
              " 1", "\n", "  "]
    per_row = [None] + _rows_of(doc, pieces) + [None]
    text = lambda g: "".join(doc[per_row[r][0]:per_row[r][1]] for r in g)
    groups = sentence_groups(per_row, doc, max_len=32)
    assert [text(g) for g in groups] == ["import os\n", "def f():\n", "    return 1\n"]
    assert sentence_groups(_rows_of("\n \n\n", ["\n", " ", "\n", "\n"]), "\n \n\n") == []  # nothing to select
    words = [f" w{i}" for i in range(31)] + [".", "\n", "\n", "\n"]
    long = "".join(words)
    assert [len(g) for g in sentence_groups(_rows_of(long, words), long, max_len=32)] == [32]  # whole, then nothing


def test_sentence_groups_cut_long_sentences_into_near_equal_parts_and_keep_no_break_spaces():
    from latentwire.select import sentence_groups

    doc = "abcdefg"
    assert [len(g) for g in sentence_groups(_rows_of(doc, list(doc)), doc, max_len=3)] == [3, 2, 2]  # not 3, 3, 1
    doc = "Mr.\u00a0Smith came. He left."
    pieces = ["Mr", ".", "\u00a0Smith", " came", ".", " He", " left", "."]
    groups = sentence_groups(_rows_of(doc, pieces), doc)
    assert ["".join(pieces[r] for r in g) for g in groups] == ["Mr.\u00a0Smith came.", " He left."]


@pytest.mark.parametrize("tokens", ["words", "characters"])
def test_sentence_groups_end_after_closing_quotes_brackets_and_cjk_stops(tokens):
    """A sentence also ends after a closing quote or bracket that follows its stop (in the same row or the next)
    and at 。！？ with no space after them; not at a decimal point or inside "e.g.x"."""
    from latentwire.select import sentence_groups

    sentences = ['He said "stop."', '  Next (see above.)', ' Then [x.]', " Done it's ok.'", " Yes “fine!”",
                 " 3.14 is pi, e.g.x fine.", " 你好。", "再见！", "好吗？"]
    doc = "".join(sentences)
    pieces = (["He", " said", ' "', "stop", '."', "  Next", " (", "see", " above", ".)", " Then", " [", "x", ".", "]",
               " Done", " it", "'s", " ok", ".'", " Yes", " “", "fine", "!”", " 3", ".", "14", " is", " pi", ",",
               " e", ".", "g", ".", "x", " fine", ".", " 你", "好", "。", "再", "见", "！", "好", "吗", "？"]
              if tokens == "words" else list(doc))
    per_row = _rows_of(doc, pieces)
    groups = sentence_groups(per_row, doc, max_len=100)
    assert ["".join(doc[per_row[r][0]:per_row[r][1]] for r in g) for g in groups] == sentences


def test_sentence_groups_keep_the_byte_rows_of_one_character_together(tokenizer):
    """A byte-level tokenizer gives each byte of "。" a row with the character's span: the group ends after the last."""
    from latentwire.select import sentence_groups

    doc = "你好。再见。"
    per_row = tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(per_row) == 3 * len(doc)  # three bytes, three rows, one span per character
    groups = sentence_groups(per_row, doc)
    assert groups == [list(range(9)), list(range(9, 18))]


@pytest.mark.parametrize("budget", [0, 1, 5, 9, 13, 40])
def test_select_rows_with_groups_spends_the_budget_exactly(budget):
    T = 20
    scores = torch.linspace(0, 1, T, dtype=torch.float64)
    keep = torch.zeros(T, dtype=torch.bool)
    keep[0] = True
    eligible = torch.ones(T, dtype=torch.bool)
    eligible[-2:] = False  # template rows at the end
    groups = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16, 17], [18, 19]]
    rows = select_rows(scores, budget, keep, eligible=eligible, groups=groups)
    chosen = set(rows.tolist()) - {0}
    assert len(chosen) == min(budget, 17) and chosen <= set(range(1, 18))
    assert torch.equal(rows, select_rows(scores, budget, keep, eligible=eligible, groups=groups))


@pytest.mark.parametrize("budget", [0, 1, 5, 9, 13, 40])
def test_fill_whole_sends_only_whole_units_within_the_budget(budget):
    T = 20
    scores = torch.linspace(0, 1, T, dtype=torch.float64)  # later groups score higher
    keep = torch.zeros(T, dtype=torch.bool)
    keep[0] = True
    eligible = torch.ones(T, dtype=torch.bool)
    eligible[-2:] = False
    groups = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16, 17], [18, 19]]
    cut = set(select_rows(scores, budget, keep, eligible=eligible, groups=groups).tolist()) - {0}
    whole = set(select_rows(scores, budget, keep, eligible=eligible, groups=groups, fill="whole").tolist()) - {0}
    units = [set(g) & set(range(1, 18)) for g in groups]
    assert all(u <= whole or not u & whole for u in units)  # every unit in or out, none cut
    assert len(whole) <= budget and whole == set().union(*(u for u in units if u <= cut))  # cut's whole units
    with pytest.raises(ValueError, match="fill"):
        select_rows(scores, budget, keep, groups=groups, fill="most")


@pytest.mark.parametrize("budget", [10, 16, 20, 29])
def test_fill_whole_with_the_unit_floor_never_sends_an_empty_message(budget):
    scores = torch.linspace(0, 1, 91, dtype=torch.float64)
    keep = torch.zeros(91, dtype=torch.bool)
    keep[0] = True
    groups = [list(range(1, 31)), list(range(31, 61)), list(range(61, 91))]  # three 30-row sentences, span 16
    rows = select_rows(scores, budget, keep, groups=groups, unit_floor=True, fill="whole").tolist()
    assert rows == [0] + groups[2]  # the best sentence whole, above a budget no sentence fits in


def test_retrieval_with_fill_whole_sends_no_cut_sentence(agent_for):
    agent = agent_for("llama")
    doc = "Ada led Orion in Lisbon. " * 4 + "Bo led Vega in Oslo. Cy led Lyra in Rome."
    cut = get_protocol("retrieval", selector="lexical", ratio=3).pick(agent, doc, "Where did Bo lead Vega?")
    whole = get_protocol("retrieval", selector="lexical", ratio=3, fill="whole").pick(agent, doc, "Where did Bo lead Vega?")
    sentences = {"Ada led Orion in Lisbon.", "Bo led Vega in Oslo.", "Cy led Lyra in Rome."}
    pieces = lambda text: {p.strip() for p in re.split(r"(?<=\.)\s+|\n", text.replace(SEPARATOR, "\n"))  # noqa: E731
                           if p.strip()}  # the gap marks between spans left out
    assert "Bo led Vega in Oslo." in whole.text and pieces(whole.text) <= sentences  # only whole sentences
    assert not pieces(cut.text) <= sentences  # where "cut" sends a piece of one
    assert whole.tokens < cut.tokens == cut.budget
    with pytest.raises(UnknownNameError, match="cut, whole"):
        get_protocol("retrieval", fill="most")
    with pytest.raises(UnknownNameError, match="cut, whole"):
        get_protocol("cacheback", fill="most")
    for name in ("retrieval", "cacheback"):  # fixed spans are not sentences: nothing "whole" to keep
        with pytest.raises(ConfigError, match="span_mode 'sentence'"):
            get_protocol(name, fill="whole", span_mode="fixed")
    with pytest.raises(ConfigError, match="fill="):
        get_protocol("cacheback_chain", fill="whole")  # its hops spend their budgets exactly


def test_cacheback_sentence_spans_keep_whole_sentences(agent_for):
    from latentwire.protocols.cacheback import CacheBack, document_rows

    agent = agent_for("llama")
    doc = "Ada led Orion in Lisbon. " * 4 + "Bo led Vega in Oslo."
    cb = CacheBack(ratio=4, latent_steps=0, span_mode="sentence")
    state = cb.read(agent, doc)
    per_row, eligible = document_rows(agent, doc, len(state))
    groups = cb.span_groups(per_row, doc)
    rows = set(cb.choose(agent, state, "Where did Bo lead?", eligible, groups).tolist())
    budget = -(-len(state) // 4)
    kept_doc = {r for r in rows if eligible[r]}
    assert len(kept_doc) == budget
    whole = [g for g in groups if set(g) <= kept_doc]
    assert sum(map(len, whole)) >= budget - max(map(len, groups))  # at most one group cut to fit


def test_a_budget_below_one_span_sends_the_best_sentence_whole_with_the_unit_floor():
    scores = torch.tensor([0.0, 1, 1, 1, 1, 5, 5, 5, 5, 5, 0, 0], dtype=torch.float64)  # rows 5..9: the best
    keep = torch.zeros(12, dtype=torch.bool)
    groups = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    cut = select_rows(scores, 3, keep, span=4, groups=groups)
    assert cut.tolist() == [5, 10, 11]  # without the floor: a lesser sentence that fits, one row of the best
    whole = select_rows(scores, 3, keep, span=4, groups=groups, unit_floor=True)
    assert whole.tolist() == [5, 6, 7, 8, 9]  # with it: the best sentence whole, not [10, 11] + a piece
    assert select_rows(scores, 5, keep, span=8, groups=groups, unit_floor=True).tolist() == [5, 6, 7, 8, 9]  # fits
    # a budget of a span or more is filled exactly as without the floor
    assert (select_rows(scores, 4, keep, span=4, groups=groups, unit_floor=True).tolist()
            == select_rows(scores, 4, keep, span=4, groups=groups).tolist())
    assert select_rows(scores, 3, keep, 4, unit_floor=True).tolist() == [5, 6, 7]  # fixed spans never use it
    assert select_rows(scores, 0, keep, span=4, groups=groups, unit_floor=True).numel() == 0


# -- adaptive budgets ----------------------------------------------------------------------------------
def test_mass_budget_takes_the_fewest_best_units_holding_the_target_mass():
    from latentwire.select import mass_budget, ranked_units

    keep = torch.zeros(12, dtype=torch.bool)
    keep[0] = True
    groups = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    scores = torch.tensor([9.0, 1, 1, 1, 10, 10, 0.5, 0.5, 0.5, 0.5, -3, 0])  # masses 3, 20, 2, 0 of 25
    spans, order = ranked_units(scores, keep, 4, None, groups)
    assert order == [1, 0, 2, 3]  # best mean first (row 0 is always kept, never a candidate)
    assert mass_budget(scores, keep, 0.8, 0, 11, 4, None, groups) == 2  # 20 / 25 = 0.8: one unit
    assert mass_budget(scores, keep, 0.81, 0, 11, 4, None, groups) == 5  # + the 3-row unit: 23 / 25
    assert mass_budget(scores, keep, 1.0, 0, 11, 4, None, groups) == 9  # every unit with mass (the -3 clipped)
    assert mass_budget(scores, keep, 1.0, 0, 6, 4, None, groups) == 6  # the cap
    assert mass_budget(scores, keep, 0.5, 4, 11, 4, None, groups) == 4  # the floor
    assert mass_budget(torch.zeros(12), keep, 0.5, 1, 7, 4, None, groups) == 7  # no positive mass: the cap
    rows = select_rows(scores, mass_budget(scores, keep, 0.81, 0, 11, 4, None, groups), keep, 4, None, groups)
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]  # exactly those units, whole
    for bad in ((0.0, 0, 5), (1.5, 0, 5), (0.5, 6, 5), (0.5, -1, 5)):
        with pytest.raises(ValueError):
            mass_budget(scores, keep, bad[0], bad[1], bad[2], 4, None, groups)


def test_cacheback_adaptive_budget_sends_between_floor_and_cap_deterministically(agent_for):
    from latentwire.errors import ConfigError
    from latentwire.protocols import get_protocol
    from latentwire.protocols.cacheback import document_rows

    agent = agent_for("qwen2")
    doc = "Ada led the Orion project in Lisbon. Bo led Vega in Oslo. The budget was 40k. Cy ran the lab."
    fixed = get_protocol("cacheback", ratio=2, latent_steps=1)
    state = fixed.read(agent, doc)
    per_row, eligible = document_rows(agent, doc, len(state))
    groups = fixed.span_groups(per_row, doc)
    cap = -(-len(state) // 2)
    floor = -(-len(state) // 16)
    sent = {}
    for q in (0.05, 0.5, 1.0):
        p = get_protocol("cacheback", ratio=2, latent_steps=1, mass=q, max_ratio=16)
        rows = p.choose(agent, state, "Where did Ada lead Orion?", eligible, groups, per_row, doc)
        doc_rows = int(eligible[rows].sum())
        assert floor <= doc_rows <= cap
        assert torch.equal(rows, p.choose(agent, state, "Where did Ada lead Orion?", eligible, groups, per_row, doc))
        sent[q] = doc_rows
    assert sent[0.05] <= sent[0.5] <= sent[1.0]
    for bad in (0, 0.0, 1.5, -0.2, "0.9"):
        with pytest.raises(ConfigError):
            get_protocol("cacheback", mass=bad)
    with pytest.raises(ConfigError, match="max_ratio"):
        get_protocol("cacheback", ratio=8, mass=0.9, max_ratio=4)
    with pytest.raises(ConfigError, match="rank scores"):  # fused ranks have no mass to measure
        get_protocol("cacheback", mass=0.9, fuse="dense")
    with pytest.raises(ConfigError, match="context rows"):  # context rows would go uncounted
        get_protocol("cacheback", mass=0.9, context="lead")
    assert get_protocol("cacheback", ratio=128).ratio == 128  # a fixed budget past max_ratio: the floor is unused
    for bad in (float("nan"), float("inf"), 0.5):
        with pytest.raises(ConfigError, match="ratio must be"):
            get_protocol("cacheback", ratio=bad)
    assert get_protocol("cacheback_chain", budget="fixed").flat["mass"] is None  # the chain's own `budget` is untouched


# -- context carried with a selected sentence ----------------------------------------------------------
def test_context_rows_name_each_sentences_paragraph_lead_or_predecessor():
    import re

    from latentwire.select import context_rows, sentence_groups

    doc = "Ann moved here. She keeps bees.\n\nBo sings. He drinks tea. He rows.\nNew line here."
    rows = re.finditer(r"\n+|[ \t]*\S+", doc)  # as a tokenizer: a row per word with the space before it, newlines apart
    per_row = [(m.start(), m.end()) for m in rows]
    groups = sentence_groups(per_row, doc, 32)
    texts = [doc[per_row[g[0]][0]:per_row[g[-1]][1]] for g in groups]
    assert texts == ["Ann moved here.", " She keeps bees.", "Bo sings.", " He drinks tea.", " He rows.",
                     "New line here."]  # rows of newlines alone are no group
    lead = context_rows(groups, per_row, doc, "lead")
    prev = context_rows(groups, per_row, doc, "previous")
    g = groups
    assert lead == [[], g[0], [], g[2], g[2], g[2]]  # one newline does not end a paragraph; a blank line does
    assert prev == [[], g[0], [], g[2], g[3], g[4]]
    assert all(c == [] for c in context_rows(groups, per_row, doc, "none"))
    with pytest.raises(ValueError):
        context_rows(groups, per_row, doc, "all")


def test_context_rows_in_one_pass_match_their_definition_on_random_documents():
    """Each group's lead / predecessor is the first / last earlier text group of its paragraph (the definition,
    quadratic in the groups, written out here; `context_rows` finds it in one pass)."""
    import bisect
    import random
    import re

    from latentwire.select import context_rows, sentence_groups

    rng = random.Random(0)
    for _ in range(30):
        doc = "".join(rng.choice(["Ann sings. ", "Bo rows! ", "x = 1\n", "\n\n", "\n", "  \n \n", "Why? "])
                      for _ in range(rng.randint(1, 40)))
        per_row = [(m.start(), m.end()) for m in re.finditer(r"\n+|[ \t]*\S+", doc)]
        groups = sentence_groups(per_row, doc, 32)
        breaks = [m.end() for m in re.finditer(r"\n[ \t]*\n", doc)]
        starts = [per_row[g[0]][0] for g in groups]  # where each group's text starts (past leading whitespace)
        starts = [a + len(doc[a:]) - len(doc[a:].lstrip()) for a in starts]
        para = [bisect.bisect_right(breaks, a) for a in starts]
        text = [any(doc[per_row[r][0]:per_row[r][1]].strip() for r in g) for g in groups]
        for kind in ("lead", "previous"):
            want = []
            for i in range(len(groups)):
                before = [j for j in range(i) if para[j] == para[i] and text[j]]
                want.append(list(groups[before[0] if kind == "lead" else before[-1]]) if before and text[i] else [])
            assert context_rows(groups, per_row, doc, kind) == want, (doc, kind)


def test_select_rows_with_context_pays_for_shared_rows_once_and_never_exceeds_the_budget():
    keep = torch.zeros(10, dtype=torch.bool)
    keep[0] = True
    groups = [[1, 2], [3, 4], [5, 6, 7], [8, 9]]  # one paragraph: [1, 2] is its lead
    context = [[], [1, 2], [1, 2], [1, 2]]
    scores = torch.tensor([0, 0.1, 0.1, 5, 5, 4, 4, 4, 0.2, 0.2])
    # the best sentence [3, 4] comes with its lead [1, 2]; the next, [5, 6, 7], adds 3 rows (the lead is paid once)
    assert select_rows(scores, 7, keep, 4, None, groups, False, context).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert select_rows(scores, 6, keep, 4, None, groups, False, context).tolist() == [0, 1, 2, 3, 4, 8, 9]
    # not even the best sentence fits with its lead: the plain selection, within the same budget
    assert torch.equal(select_rows(scores, 3, keep, 4, None, groups, False, context),
                       select_rows(scores, 3, keep, 4, None, groups))
    for budget in range(0, 11):
        rows = select_rows(scores, budget, keep, 4, None, groups, False, context)
        assert len(rows) - 1 <= budget and rows.tolist() == sorted(set(rows.tolist()))
    with pytest.raises(ValueError, match="context"):
        select_rows(scores, 4, keep, 4, None, None, False, context)


def test_cacheback_and_retrieval_send_the_lead_with_the_sentence(agent_for):
    from latentwire.errors import ConfigError
    from latentwire.protocols.cacheback import document_rows

    agent = agent_for("llama")
    doc = ("Dmitri Zeller moved here in 2009. He is afraid of thunder. Every morning he drinks oat milk.\n\n"
           "Nadia Molnar moved here in 2013. Every morning she drinks mocha. She bakes gingerbread.")
    lead_text = "Dmitri Zeller moved here in 2009."
    retr = get_protocol("retrieval", selector="lexical", ratio=2, context="lead").pick(agent, doc, "oat milk?")
    assert lead_text in retr.text and "oat milk" in retr.text
    cb = get_protocol("cacheback", ratio=2, latent_steps=1, context="lead", selector="lexical")
    state = cb.read(agent, doc)
    per_row, eligible = document_rows(agent, doc, len(state))
    rows = cb.choose(agent, state, "oat milk?", eligible, cb.span_groups(per_row, doc), per_row, doc)
    kept = [per_row[r] for r in rows.tolist() if r < len(per_row) and per_row[r] is not None]
    text = "".join(doc[a:b] for a, b in kept)
    assert "Dmitri" in text and "oat" in text
    for name in ("cacheback", "retrieval"):
        with pytest.raises(UnknownNameError, match="valid: lead, none, previous"):
            get_protocol(name, context="paragraph")
        with pytest.raises(ConfigError, match="sentence"):
            get_protocol(name, context="lead", span_mode="fixed")
    with pytest.raises(ConfigError, match="fan-in"):
        get_protocol("cacheback_chain", context="lead")
