"""Background-calibrated CacheBack: rows every query reads stop spending budget; follow-ups reuse the background."""
import pytest
import torch

from latentwire.errors import UnknownNameError
from latentwire.protocols.calibration import GENERIC_QUESTION, calibrate, masked_question
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.protocols.stages import Probe, Sentences
from latentwire.select import always_kept, fanin_budget, select_rows
from latentwire.select.cacheback import cacheback_scores


def _attention(rows: dict[int, float], T: int = 6, m: int = 4) -> torch.Tensor:
    """(S = 1, m, T) hand-made attention: every query token puts `rows[t]` on row t, the rest on row 0."""
    b = torch.zeros(1, m, T, dtype=torch.float64)
    for t, w in rows.items():
        b[0, :, t] = w
    b[0, :, 0] = 1 - b[0].sum(dim=-1)
    return b


def test_a_row_every_query_reads_loses_to_a_row_only_this_question_reads():
    # Row 2: read by the question (0.30) and by the content-free query (0.30) alike. Row 4: read by the
    # question only (0.20). Uncalibrated, row 2 wins; calibrated, row 4 does.
    question = cacheback_scores(_attention({2: 0.30, 4: 0.20}), p=2, pooling="none", window=1)
    background = cacheback_scores(_attention({2: 0.30, 4: 0.01}), p=2, pooling="none", window=1)
    assert question[2] > question[4]
    calibrated = calibrate(question, background)
    assert calibrated[4] > calibrated[2]
    assert torch.argmax(calibrated[1:]) + 1 == 4


def test_the_floor_keeps_rows_nobody_reads_from_winning():
    question = torch.tensor([0.5, 1e-9, 0.3, 0.2], dtype=torch.float64)
    background = torch.tensor([0.5, 1e-12, 0.1, 0.4], dtype=torch.float64)
    out = calibrate(question, background, floor=0.05)
    assert int(torch.argmax(out)) == 2  # not row 1, whose 1e-9 / 1e-12 would be the largest raw ratio
    with pytest.raises(ValueError):
        calibrate(question, background[:3])


def test_masked_question_keeps_shape_and_function_words():
    q = "Which city is the Falcon project based in?"
    m = masked_question(q)
    assert m == "Which thing is the thing thing thing in?"
    assert len(m.split()) == len(q.split())
    assert masked_question("What is 7 times 6?") == "What is thing thing thing?"


def test_generic_background_is_scored_once_per_stored_state(agent_for):
    agent = agent_for("llama")
    cb = CacheBack(ratio=4, latent_steps=0, calibration="generic")
    doc = "The blue crate holds 58 bolts. The red crate holds 12 nails. The green crate is empty."
    state = cb.read(agent, doc)
    seen = []
    score = cb.attention._selector.score
    cb.attention._selector.score = lambda a, s, q: seen.append(q) or score(a, s, q)
    _, eligible = document_rows(agent, doc, len(state))
    first = cb.choose(agent, state, "How many bolts?", eligible)
    cb.choose(agent, state, "How many nails?", eligible)
    background = cb.attention.query_text(agent, GENERIC_QUESTION)
    assert seen.count(background) == 1 and len(seen) == 3  # two questions + one background, not two
    assert first.numel() > 0
    other = cb.read(agent, doc)  # another stored state gets its own background
    cb.choose(agent, other, "How many bolts?", eligible)
    assert seen.count(background) == 2


def test_calibration_changes_the_selection_only_through_the_scores(agent_for):
    agent = agent_for("qwen2")
    doc = "The blue crate holds 58 bolts. The red crate holds 12 nails. " * 3
    plain, masked = CacheBack(ratio=4, latent_steps=2), CacheBack(ratio=4, latent_steps=2, calibration="masked")
    state = plain.read(agent, doc)
    a, b = plain.scores(agent, state, "How many bolts?"), masked.scores(agent, state, "How many bolts?")
    assert a.shape == b.shape == (len(state),) and bool(torch.isfinite(b).all()) and not torch.equal(a, b)
    # masked = the plain scores over those of the masked question, floored (`calibrate`), nothing else
    background = plain.scores(agent, state, masked_question("How many bolts?"))
    assert torch.equal(b, calibrate(a, background, masked.score.floor))
    _, eligible = document_rows(agent, doc, len(state))
    want = select_rows(b, fanin_budget(len(state), 4), always_kept(state), masked.span, eligible)
    assert torch.equal(masked.choose(agent, state, "How many bolts?", eligible), want)


def test_bad_calibration_settings_are_typed_errors():
    with pytest.raises(UnknownNameError, match="valid: generic, masked, none"):
        CacheBack(calibration="ratio")
    with pytest.raises(ValueError, match="query-conditioned"):
        CacheBack(calibration="generic", selector="streaming_llm")
    with pytest.raises(ValueError, match="calibration_floor"):
        CacheBack(calibration="generic", calibration_floor=0)


def test_a_calibrated_protocol_pickles_without_its_cache(agent_for):
    import pickle

    cb = CacheBack(ratio=4, latent_steps=0, calibration="generic")
    state = cb.read(agent_for("llama"), "The blue crate holds 58 bolts.")
    cb.scores(agent_for("llama"), state, "How many bolts?")
    again = pickle.loads(pickle.dumps(cb))
    assert again == cb and len(again._memo) == 0


@pytest.mark.kvpress
def test_question_aware_sender_reads_the_question_and_sends_document_rows_only(agent_for):
    agent = agent_for("llama")
    doc, question = "The blue crate holds 58 bolts. The red crate holds 12 nails.", "How many bolts?"
    cb = CacheBack(ratio=4, latent_steps=0, selector="snapkv", query_aware=True)
    with pytest.raises(ValueError, match="question="):
        cb.read(agent, doc)
    state = cb.read(agent, doc, question)
    blind = CacheBack(ratio=4, latent_steps=0).read(agent, doc)
    assert len(state) > len(blind)  # the question is in the sender's own prompt
    per_row, eligible = document_rows(agent, doc, len(state), cb.sender_prompt(doc, question))
    assert int(eligible.sum()) == int(document_rows(agent, doc, len(blind))[1].sum())  # question rows never eligible
    rows = cb.choose(agent, state, question, eligible)
    assert all(bool(eligible[r]) or r == 0 for r in rows.tolist())
    out = cb.run([agent], [doc], agent, question)
    assert out.details["message_rows"] == len(rows)


@pytest.mark.kvpress
def test_question_aware_snapkv_observes_the_question_not_the_document_tail(agent_for):
    agent = agent_for("llama")
    doc, question = "The blue crate holds 58 bolts. The red crate holds 12 nails. " * 6, "How many bolts?"
    cb = CacheBack(ratio=4, latent_steps=0, selector="snapkv", query_aware=True)
    state = cb.read(agent, doc, question)
    per_row, _ = document_rows(agent, doc, len(state), cb.sender_prompt(doc, question))
    after_doc = len(per_row) - 1 - max(i for i, span in enumerate(per_row) if span is not None)
    held = cb.held(agent, state, per_row=per_row)
    assert cb.attention.selector_for(held).window_size == after_doc < 64  # the question and the template's tail
    assert cb.attention.selector_for(held) is cb.attention.selector_for(held)  # one instance: its timings readable
    assert cb.attention.selector_for(None) is cb.attention._selector
    # SnapKV marks its window's rows max + 1: with the question as window, no document row is among them
    scores = cb.scores(agent, state, question, per_row)
    window_rows = torch.arange(len(per_row) - after_doc, len(per_row))
    assert bool((scores[window_rows] == scores.max()).all())
    assert float(scores[: len(per_row) - after_doc].max()) < float(scores.max())
    fixed = CacheBack(ratio=4, latent_steps=0, selector="snapkv", query_aware=True, selector_params={"window_size": 64})
    assert fixed.attention.selector_for(held).window_size == 64  # an explicit window is kept


def test_variant_names():
    cb = CacheBack.variant("cacheback+masked/sentence", ratio=4)
    flat = cb.flat
    assert (flat["selector"], flat["calibration"], flat["span_mode"], cb.ratio) == ("cacheback", "masked", "sentence", 4)
    assert CacheBack.variant("bm25").flat["calibration"] == "none"
    with pytest.raises(UnknownNameError):
        CacheBack.variant("cacheback/lines")
    deep = CacheBack.variant("cacheback@deep+generic/sentence", ratio=8)  # contrastive CacheBack, as rival names it
    assert (deep.selector, deep.flat["calibration"], deep.flat["span_mode"]) == ("cacheback", "generic", "sentence")
    assert deep.flat["selector_params"] == {"p": 0.0, "min_depth": 0.5} and deep.attention._selector.min_depth == 0.5
    with pytest.raises(UnknownNameError, match="valid: deep"):
        CacheBack.variant("cacheback@shallow")
    merged = CacheBack.variant("cacheback@deep", selector_params={"p": 1.0})  # explicit parameters win, preset kept
    assert merged.flat["selector_params"] == {"p": 1.0, "min_depth": 0.5}
    probed = CacheBack.variant("cacheback/sentence:probe=16:context=lead", ratio=8)  # fields after ':'
    assert (probed.score, probed.units, probed.ratio) == (Probe(16), Sentences(context="lead"), 8)
    assert CacheBack.variant("cacheback:probe=4", probe=2).score == Probe(2)  # keywords win over the name
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        CacheBack.variant("cacheback:probe")
    with pytest.raises(ValueError, match="probe"):  # the field's own validation still runs
        CacheBack.variant("cacheback:probe=-1")


def test_the_generic_background_is_part_of_the_read_not_of_the_question(agent_for):
    # The background does not depend on the question: an agent that holds its document has it before a question
    # arrives, so it counts in the read's seconds (cold TTEOA) and not in the question-time TTEOA.
    import time

    agent = agent_for("qwen2")
    cb = CacheBack(ratio=4, latent_steps=1, calibration="generic")
    background = cb.score.generic
    cb.score.generic = lambda h: time.sleep(0.2) or background(h)
    doc = "The blue crate holds 58 bolts. The red crate holds 12 nails."
    out = cb.run([agent], [doc], agent, "How many bolts?")
    timing = out.details["senders"][0]
    assert timing["background_s"] >= 0.2 and timing["read_s"] >= timing["background_s"]
    assert out.tteoa - out.question_tteoa == pytest.approx(timing["read_s"], abs=1e-9)
    assert out.sender_seconds[0] == pytest.approx(timing["read_s"] + timing["select_s"], abs=1e-9)
    masked = CacheBack(calibration="masked")
    assert masked.score.generic(masked.held(agent, cb.read(agent, doc))) is None  # masked: nothing before a question
