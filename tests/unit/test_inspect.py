"""`latentwire inspect`: the page shows each selector's kept text and underlines the gold evidence."""
import html

import torch

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span
from latentwire.bench.inspect import _render, inspect_episode
from latentwire.models import tiny_model, tiny_tokenizer


def test_render_marks_kept_text_and_underlines_gold():
    html = _render("ab<c>d", [0, 0.5, 0.5, 0, 0, 0], [False, False, True, True, True, False])
    assert html == ('a<span style="background:rgba(255,170,0,0.50)">b</span>'
                    '<span style="background:rgba(255,170,0,0.50)"><u>&lt;</u></span><u>c&gt;</u>d')


def test_inspect_page_has_one_column_per_selector_and_the_gold_evidence():
    torch.set_num_threads(1)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama")
    doc = "Filler words here. The code is 7341. More filler follows now."
    ep = Episode("e", "t", "fanin", "What is the code?", ["7341"], (doc,), (Span(0, 19, 36),))
    page = inspect_episode(agent, ep, ["cacheback", "streaming_llm", "cacheback@deep+generic/sentence",
                                       "lexical/sentence"], ratio=4, latent_steps=1)
    assert page.count("<div class=doc>") == 4 and "<b>cacheback</b>" in page and "<b>streaming_llm</b>" in page
    assert "<u>" in page and "background:rgba(255,170,0," in page
    lexical = page.split("<b>lexical/sentence</b>")[1]  # a text selector: the question's words pick the sentence
    assert '<span style="background:rgba(255,170,0,1.00)"><u>The code is 7341.</u></span>' in lexical


def test_inspect_page_explains_rows_budget_and_compression():
    import re

    torch.set_num_threads(1)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama")
    doc = "Filler words here. The code is 7341. More filler follows now."
    ep = Episode("e", "t", "fanin", "What is the code?", ["7341"], (doc,), (Span(0, 19, 36),))
    page = inspect_episode(agent, ep, ["cacheback"], ratio=4, latent_steps=2)
    assert "Compression = the document&#x27;s rows ÷ the document rows sent" in page
    T, prompt, n_doc, budget = map(int, re.search(
        r"T = (\d+) rows \((\d+) prompt, (\d+) of them document, \+ 2 latent\); budget B = ceil\(\d+ / 4\) = (\d+)",
        page).groups())
    assert T == prompt + 2 and budget == -(-T // 4)
    sent, d, first, lat, comp, total, d2 = re.search(
        r"(\d+) rows sent = (\d+) document \+ (\d+) first \+ (\d+) latent · compression ([\d.]+)× \((\d+) ÷ (\d+)",
        page).groups()
    assert int(sent) == int(d) + int(first) + int(lat) and (int(first), int(lat)) == (1, 2) and int(d) <= budget
    assert int(total) == n_doc and d2 == d and float(comp) == round(n_doc / int(d), 2) < 4


def test_inspect_page_shows_what_the_answer_probe_said():
    from latentwire.agent import KV_PROMPT
    from latentwire.protocols.cacheback import CacheBack

    torch.set_num_threads(1)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama")
    doc = "Filler words here. The code is 7341. More filler follows now."
    ep = Episode("e", "t", "fanin", "What is the code?", ["7341"], (doc,), (Span(0, 19, 36),))
    page = inspect_episode(agent, ep, ["cacheback/sentence:probe=3", "cacheback/sentence"], ratio=4, latent_steps=1)
    state = CacheBack(latent_steps=1).read(agent, doc)
    said = agent.tokenizer.decode(list(agent.answer_after(state, KV_PROMPT.format(question=ep.question),
                                                          max_new_tokens=3).token_ids), skip_special_tokens=True)
    probed, plain = page.split("<b>cacheback/sentence:probe=3</b>")[1].split("<b>cacheback/sentence</b>")
    assert said and "probe: " + html.escape(repr(said)) in probed and "probe:" not in plain
