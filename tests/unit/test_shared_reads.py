"""One read per sender: inside `shared_reads()` every protocol starting from a sender's state reuses it,
and is charged the read's measured time; outside it nothing is kept."""
import json

import pytest
import torch

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span, write_episodes
from latentwire.bench.runner import RunConfig, run
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.protocols import get_protocol
from latentwire.errors import ConfigError, UnknownNameError
from latentwire.protocols.reads import HeldReads, _entry_bytes, read, shared_reads, text_key

DOC, Q = "The blue crate holds 58 bolts. The red crate holds 12 nails.", "How many bolts?"


def _prefills(agent: Agent) -> int:
    return sum(c.op == "prefill" for c in agent.calls)


def test_outside_a_block_every_read_is_computed(agent_for):
    agent = agent_for("llama")
    a, b = read(agent, DOC, 2, "rescale"), read(agent, DOC, 2, "rescale")
    assert a.state is not b.state and not a.shared and not b.shared and _prefills(agent) == 2
    assert torch.equal(a.state.layers[0].keys, b.state.layers[0].keys)


def test_inside_a_block_a_read_is_computed_once_and_charged_its_measured_time(agent_for):
    agent = agent_for("qwen2")
    with shared_reads() as memo:
        first = read(agent, DOC, 2, "rescale")
        again = read(agent, DOC, 2, "rescale")
        other_g = read(agent, DOC, 0, "rescale")  # G = 0: its state is the prefill G = 2 computed
        other_doc = read(agent, DOC + " More.", 2, "rescale")
        assert again.state is first.state and again.shared and not first.shared
        assert again.seconds == first.seconds > 0
        assert len(other_g.state) == len(first.state) - 2 and other_g.shared and 0 < other_g.seconds < first.seconds
        assert _prefills(agent) == 2  # DOC once (shared by G = 2 and G = 0), the other document once
        assert other_doc.state is not first.state and len(memo) == 4  # 2 prefills (G = 0's state) + 2 states
    assert len(memo) == 0  # a block keeps nothing once it closes
    assert not read(agent, DOC, 2, "rescale").shared


def test_protocols_share_a_read_and_report_it(agent_for, spy_decode):
    agent = agent_for("llama")
    seen = spy_decode(agent)  # what each answer decodes from (tiny llama's tokens ignore the context)
    protocols = [get_protocol("fullkv", latent_steps=1, query_aware=False, max_new_tokens=1),
                 get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=1),
                 get_protocol("cacheback", ratio=8, latent_steps=1, max_new_tokens=1),
                 get_protocol("merge", latent_steps=1, query_aware=False, max_new_tokens=1)]
    with shared_reads():
        outs = [p.run([agent], [DOC], agent, Q) for p in protocols]
    assert _prefills(agent) == 1  # one sender read for four protocols (receivers record "answer")
    assert outs[0].details["shared_reads"] == 0 and outs[3].details["shared_reads"] == 1
    assert [o.details["senders"][0]["shared_read"] for o in outs[1:3]] == [True, True]
    # every protocol is charged at least the one measured read
    sender = outs[1].details["senders"][0]
    read_s = sender["read_s"] - sender["layout_s"]  # CacheBack's read_s also holds its document layout
    assert sender["layout_s"] > 0
    assert all(min(o.sender_seconds) >= read_s for o in outs)
    # alone, each protocol's receiver decodes from the same input as when sharing (states are values)
    shared_inputs = list(seen)
    alone = [p.run([agent], [DOC], agent, Q) for p in protocols]
    assert [o.answer for o in alone] == [o.answer for o in outs]
    assert len(seen) == 2 * len(protocols)
    for (s0, h0, k0), (s1, h1, k1) in zip(shared_inputs, seen[len(protocols):], strict=True):
        assert s0 == s1 and torch.equal(h0, h1) and all(torch.equal(x, y) for x, y in zip(k0, k1, strict=True))
    assert not torch.equal(shared_inputs[0][1], shared_inputs[1][1])  # full KV and CacheBack differ: not vacuous


def test_the_runner_reads_each_sender_once_per_episode(tmp_path):
    eps = [Episode(f"e{i}", "t", "fanin", "What is the code?", ["7341"],
                   ("The code is 7341. " * (1 + i), "Nothing here."), (Span(0, 0, 17),)) for i in range(2)]
    write_episodes(tmp_path / "task.jsonl", eps)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    spec = ",".join(f"cacheback(ratio={r}, latent_steps=1, max_new_tokens=1)" for r in (2, 4, 8, 16))
    run(RunConfig(str(tmp_path / "task.jsonl"), spec + ",fullkv(latent_steps=1, query_aware=False, max_new_tokens=1)",
                  "llama"), tmp_path / "run", progress=False, agent=agent)
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 10 and all(r["error"] is None for r in records)
    assert _prefills(agent) == 2 * 2  # 2 episodes × 2 senders; without sharing 2 × 5 × 2
    assert [r["episode"] for r in records] == ["e0"] * 5 + ["e1"] * 5  # episode by episode


# -- text reports: one greedy decode serves every cap it covers ---------------------------------------
def _answers(agent: Agent) -> int:
    return sum(c.op == "answer" for c in agent.calls)


def test_a_truncated_answer_is_the_capped_decode(agent_for):
    agent = agent_for("llama")
    long = agent.answer(Q, max_new_tokens=12)
    assert len(long.token_seconds) == len(long.token_ids) + long.stopped
    assert list(long.token_seconds) == sorted(long.token_seconds) and long.decode_seconds >= long.token_seconds[-1]
    for cap in (1, 5, len(long.token_ids)):
        short, alone = long.truncated(cap, agent.tokenizer), agent.answer(Q, max_new_tokens=cap)
        assert (short.token_ids, short.text, short.context) == (alone.token_ids, alone.text, alone.context)
        assert short.decode_seconds == long.token_seconds[cap - 1] and short.prefill_seconds == long.prefill_seconds
    if not long.stopped:
        assert long.truncated(13, agent.tokenizer) is None  # beyond a capped decode: unknown


def test_a_stopped_answer_serves_any_larger_cap():
    from latentwire.agent import Answer

    stopped = Answer("a b", (5, 6), 10, 0, 12, 0.5, 0.3, (0.1, 0.2, 0.3))  # two tokens, then the stop token
    assert stopped.stopped
    tok = type("Tok", (), {"decode": staticmethod(lambda ids, skip_special_tokens: " ".join(map(str, ids)))})
    big = stopped.truncated(50, tok)
    assert (big.token_ids, big.decode_seconds, big.stopped) == ((5, 6), 0.3, True)  # charged up to the stop
    one = stopped.truncated(1, tok)
    assert (one.token_ids, one.text, one.decode_seconds, one.stopped, one.context) == ((5,), "5", 0.1, False, 11)
    none = stopped.truncated(0, tok)  # a cap of 0 chooses nothing (was an IndexError)
    assert (none.token_ids, none.text, none.decode_seconds, none.stopped, none.context) == ((), "", 0.0, False, 10)


def test_reports_share_one_decode_inside_a_block(agent_for):
    from latentwire.protocols.reads import report

    agent = agent_for("gemma3")  # tiny gemma3's tokens vary with the step (tiny qwen2 and llama repeat one token)
    alone = {cap: agent.answer(Q, max_new_tokens=cap) for cap in (3, 6)}
    assert len(set(alone[6].token_ids)) > 1
    before = _answers(agent)
    with shared_reads():
        six = report(agent, Q, 6)
        three = report(agent, Q, 3)
        assert not six.shared and three.shared and _answers(agent) == before + 1
        assert three.answer.token_ids == alone[3].token_ids and six.answer.token_ids == alone[6].token_ids
        if not six.answer.stopped:
            nine = report(agent, Q, 9)  # beyond the capped decode: decoded again, and kept
            assert not nine.shared and _answers(agent) == before + 2
            assert report(agent, Q, 7).shared
    outside = report(agent, Q, 3)
    assert not outside.shared and outside.answer.token_ids == alone[3].token_ids


def test_text_protocols_at_two_budgets_share_their_reports(agent_for, spy_decode):
    agent = agent_for("gemma3")
    small, big = get_protocol("text", max_report_tokens=4, max_new_tokens=2), get_protocol("text", max_new_tokens=2)
    ref = small.run([agent], [DOC], agent, Q)
    with shared_reads():
        b = big.run([agent], [DOC], agent, Q)
        s = small.run([agent], [DOC], agent, Q)
    assert s.details["shared_reports"] == [True] and b.details["shared_reports"] == [False]
    assert (s.answer, s.details["reports"]) == (ref.answer, ref.details["reports"])
    seen = spy_decode(agent)  # the receivers' inputs, not only their (short) answers
    small.run([agent], [DOC], agent, Q)
    with shared_reads():
        big.run([agent], [DOC], agent, Q)
        small.run([agent], [DOC], agent, Q)
    # decodes: small alone (report, answer), big (report, answer), small in the block (answer: its report shared)
    assert len(seen) == 5
    assert torch.equal(seen[1][1], seen[4][1]) and seen[1][0] == seen[4][0]  # the same input to the same answer


# -- held reads: agents that already hold their documents ------------------------------------------
def test_a_held_read_serves_k_questions_from_one_read_charged_zero_after_the_first(agent_for):
    agent = agent_for("qwen2")
    held = HeldReads()
    fresh = read(agent, DOC, 2, "rescale").state  # outside any block: the reference
    served = []
    for _ in range(3):  # three questions, three blocks
        with shared_reads(held):
            served.append(read(agent, DOC, 2, "rescale"))
    assert held.reads_computed == 2  # one prefill + one latent-step run, for all three questions
    assert [r.held for r in served] == [False, True, True] and served[0].seconds > 0
    assert served[1].seconds == served[2].seconds == 0.0  # read before the question arrived: question time
    assert all(r.state is served[0].state for r in served)
    for a, b in zip(fresh.layers, served[2].state.layers):  # the held state is the state a fresh read gives
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert held.nbytes >= fresh.nbytes > 0


def test_a_protocol_on_held_reads_answers_as_a_fresh_run_with_question_time_seconds(agent_for, spy_decode):
    agent = agent_for("llama")
    seen = spy_decode(agent)
    proto = get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=1)
    cold = proto.run([agent], [DOC], agent, Q)
    held = HeldReads()
    outs = []
    for _ in range(2):
        with shared_reads(held):
            outs.append(proto.run([agent], [DOC], agent, Q))
    assert held.reads_computed == 2 and len(seen) == 3
    for s1, h1, k1 in seen[1:]:  # the receiver decodes from the same input all three times
        assert s1 == seen[0][0] and torch.equal(h1, seen[0][1]) and all(map(torch.equal, k1, seen[0][2]))
    assert outs[0].answer == outs[1].answer == cold.answer
    assert outs[1].details["senders"][0]["read_s"] == 0.0 < outs[0].details["senders"][0]["read_s"]


def test_held_reads_stay_within_their_bound_least_recently_used_first(agent_for):
    agent = agent_for("llama")
    held = HeldReads(max_bytes=0)
    with shared_reads(held):
        read(agent, DOC, 1, "rescale")
        assert held.nbytes > 0  # kept while the block runs
    assert held.nbytes == 0 and held.dropped == 2 and not held.memo
    one = read(agent, DOC, 1, "rescale").state.nbytes
    held = HeldReads(max_bytes=3 * one)  # room for one document's prefill + state, not two documents'
    with shared_reads(held):
        read(agent, DOC, 1, "rescale")
    with shared_reads(held):
        read(agent, DOC + " More words here.", 1, "rescale")
    assert held.nbytes <= 3 * one and held.dropped >= 1
    with shared_reads(held):
        assert read(agent, DOC + " More words here.", 1, "rescale").held  # the recent one is kept
    for bad in (-1, True, 2.5, "1GB"):
        with pytest.raises(ConfigError, match="max_bytes"):
            HeldReads(max_bytes=bad)


def test_question_time_tteoa_leaves_out_the_reads_a_holding_agent_has_done(agent_for):
    """Records carry both timings: cold TTEOA (reads included) and question-time TTEOA (each sender's seconds without
    its query-blind read). A read held from an earlier question is charged 0 s, so then the two agree."""
    from latentwire.protocols.base import Outcome

    out = Outcome("x", "a", 0, 0, (3.0, 5.0), 1.0, read_seconds=(2.5, 1.0))
    assert out.tteoa == 6.0 and out.question_tteoa == pytest.approx(5.0)  # max(0.5, 4.0) + 1
    assert Outcome("x", "a", 0, 0, (3.0,), 1.0).question_tteoa is None  # reads not separable
    assert Outcome("x", "a", 0, 0, (), 2.0, read_seconds=()).question_tteoa == 2.0

    agent = agent_for("llama")
    docs, question = ["Ada led Orion in Lisbon.", "Bo led Vega in Oslo."], "Where did Ada lead Orion?"
    cb = get_protocol("cacheback", ratio=2, latent_steps=2)
    held = HeldReads()
    with shared_reads(held):
        cold = cb.run([agent] * 2, docs, agent, question)
    with shared_reads(held):
        warm = cb.run([agent] * 2, docs, agent, "Where did Bo lead Vega?")
    assert cold.read_seconds == tuple(t["read_s"] for t in cold.details["senders"]) and min(cold.read_seconds) > 0
    assert cold.question_tteoa < cold.tteoa
    assert warm.read_seconds == (0.0, 0.0) and warm.question_tteoa == pytest.approx(warm.tteoa)
    assert get_protocol("cacheback", ratio=2, latent_steps=1, query_aware=True).run(
        [agent] * 2, docs, agent, question).question_tteoa is None  # it read the question with its document
    assert get_protocol("text", max_report_tokens=4).run([agent] * 2, docs, agent, question).question_tteoa is None
    full = get_protocol("fullkv", latent_steps=1).run([agent] * 2, docs, agent, question)
    assert full.question_tteoa == pytest.approx(full.receiver_seconds)  # the held states are the message
    ret = get_protocol("retrieval", selector="lexical", ratio=2).run([agent] * 2, docs, agent, question)
    assert ret.question_tteoa == pytest.approx(ret.tteoa)  # no read: every second follows the question
    ctx = get_protocol("fullcontext", max_new_tokens=2).run([agent] * 2, docs, agent, question)
    assert ctx.question_tteoa == pytest.approx(ctx.tteoa)  # the receiver reads every document after the question


def test_time_to_first_token_leaves_out_the_rest_of_the_answer(agent_for):
    """TTFT = TTEOA − the receiver's decode after its first token: it compares protocols whose answers differ in
    length (a one-word translator reply against a sentence)."""
    from latentwire.protocols.base import Outcome, after_first

    assert Outcome("x", "a", 0, 0, (2.0,), 1.5, after_first=1.0).ttft == pytest.approx(2.5)
    assert Outcome("x", "a", 0, 0, (2.0,), 1.5).ttft is None
    agent = agent_for("llama")
    docs, question = ["Ada led Orion in Lisbon.", "Bo led Vega in Oslo."], "Where did Ada lead Orion?"
    for name, params in (("alone", {}), ("text", {"max_report_tokens": 4}), ("cacheback", {"latent_steps": 1}),
                         ("fullkv", {"latent_steps": 1}), ("fullcontext", {}), ("retrieval", {"selector": "lexical"})):
        out = get_protocol(name, max_new_tokens=6, **params).run([agent] * 2, docs, agent, question)
        assert out.after_first is not None and 0 <= out.after_first <= out.receiver_seconds
        assert out.ttft == pytest.approx(out.tteoa - out.after_first)
    reply = agent.answer(question, max_new_tokens=5)
    assert after_first(reply) == pytest.approx(reply.decode_seconds - reply.token_seconds[0])


def test_answer_after_prefills_only_the_new_turn_onto_the_held_state(agent_for):
    """`Agent.answer_after(state, user)` decodes what the model gives after the held read and the new turn: its
    first token is the argmax after `extend(state, user)`; the prompt it prefills is the turn alone."""
    agent = agent_for("qwen2")
    state = agent.prefill("Read this document.\n\n" + DOC)
    turn = "Quote the one sentence of the document above that best answers: " + Q
    ans = agent.answer_after(state, turn, max_new_tokens=4)
    extended = agent.extend(state, turn)
    with torch.inference_mode():
        assert ans.token_ids[0] == int(agent.logits(extended.last_hidden).argmax())
    assert ans.message_rows == len(state) and ans.prompt_tokens == len(extended) - len(state)
    assert ans.token_ids == agent.answer_after(state.shift(7), turn, max_new_tokens=4).token_ids  # relative attention


def test_held_text_reports_read_each_document_once_and_have_a_question_time(agent_for):
    """text(read="held"): the sender read its document before the question (the same read CacheBack's senders
    share); at question time it prefills only the question's turn and decodes. Over held reads the second
    question pays no read; its report equals `answer_after` on a fresh read."""
    agent = agent_for("llama")
    docs = ["Ada led Orion in Lisbon.", "Bo led Vega in Oslo."]
    text = get_protocol("text", read="held", max_report_tokens=4, max_new_tokens=2)
    held = HeldReads()
    with shared_reads(held):
        first = text.run([agent] * 2, docs, agent, "Where did Ada lead Orion?")
        cb = get_protocol("cacheback", ratio=2, latent_steps=0, max_new_tokens=2).run(
            [agent] * 2, docs, agent, "Where did Ada lead Orion?")
    # per document one prefill, which is its G = 0 state; CacheBack at G = 0 reused text's reads
    assert held.reads_computed == 2 and cb.details["senders"][0]["shared_read"]
    states = sum(read(agent, "Read this document.\n\n" + d, 0, "rescale").state.nbytes for d in docs)
    layouts = sum(_entry_bytes(v) for k, v in held.memo.items() if k[:2] == ("index", "layout"))  # CacheBack's
    assert held.indexes_computed == 2 and held.nbytes == states + layouts and 0 < layouts < states
    with shared_reads(held):
        warm = text.run([agent] * 2, docs, agent, "Where did Bo lead Vega?")
        cb_warm = get_protocol("cacheback", ratio=2, latent_steps=0, max_new_tokens=2).run(
            [agent] * 2, docs, agent, "Where did Bo lead Vega?")
    assert held.reads_computed == 2  # no new read for the second question
    # CacheBack's document layout is held with the read: the follow-up's question time pays neither
    assert all(s["layout_s"] > 0 for s in cb.details["senders"]) and held.indexes_computed == 2
    assert [(s["read_s"], s["layout_s"]) for s in cb_warm.details["senders"]] == [(0.0, 0.0)] * 2
    assert min(first.read_seconds) > 0 and first.question_tteoa < first.tteoa
    assert warm.read_seconds == (0.0, 0.0) and warm.question_tteoa == pytest.approx(warm.tteoa)
    by_hand = agent.answer_after(agent.prefill("Read this document.\n\n" + docs[1]),
                                 "Quote the one sentence of the document above that best answers: "
                                 "Where did Bo lead Vega?", max_new_tokens=4)
    assert warm.details["reports"][1] == by_hand.text
    with pytest.raises(UnknownNameError, match="valid: held, with_question"):
        get_protocol("text", read="cached")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_read_that_cannot_be_held_is_refused_before_any_compute(agent_for, arch):
    """What holding a read costs is known before it runs (`read_bytes`: Gemma3's sliding layers keep their last
    window unless the read keeps full history); a read bigger than the holder's bound alone is refused, typed."""
    from latentwire.errors import HeldMemoryError
    from latentwire.protocols.reads import read_bytes

    agent = agent_for(arch)
    long_doc = DOC * 3
    rows = len(agent.chat_ids(long_doc))
    assert read_bytes(agent, rows) == agent.prefill(long_doc).nbytes
    assert read_bytes(agent, rows, True) == agent.prefill(long_doc, full_history=True).nbytes
    assert (read_bytes(agent, rows, True) > read_bytes(agent, rows)) == (arch == "gemma3")
    held, before = HeldReads(max_bytes=read_bytes(agent, rows)), len(agent.calls)
    with pytest.raises(HeldMemoryError, match="max_bytes"):  # prefill + a finished state of rows + 2: too big
        with shared_reads(held):
            read(agent, long_doc, 2, "rescale")
    assert len(agent.calls) == before and not held.memo


def test_a_read_without_latent_steps_is_held_once_and_fits_a_bound_of_its_own_size(agent_for):
    """G = 0: the finished state is the prefill itself, held (and counted) once."""
    from latentwire.protocols.reads import read_bytes

    agent = agent_for("qwen2")
    size = read_bytes(agent, len(agent.chat_ids(DOC)))
    held = HeldReads(max_bytes=size)
    with shared_reads(held):
        r = read(agent, DOC, 0, "rescale")
    assert held.nbytes == r.state.nbytes == size and held.reads_computed == 1 and not held.dropped
    with shared_reads(held):
        again = read(agent, DOC, 0, "rescale")
    assert again.held and again.seconds == 0.0 and again.state is r.state


def test_held_text_refuses_an_overflowing_report_before_any_sender_reads(agent_for):
    """text (held or not) checks every sender's document, question turn and report budget against its window
    before the first sender computes anything."""
    from latentwire.errors import ContextOverflowError

    agent = agent_for("llama")
    docs = ["Ada led Orion in Lisbon.", "Bo led Vega in Oslo. " * 40]
    agent.context_window = len(agent.chat_ids("Read this document.\n\n" + docs[1])) + 5
    for spec in (dict(read="held"), {}):
        before = len(agent.calls)
        with pytest.raises(ContextOverflowError):
            with shared_reads(HeldReads()):
                get_protocol("text", max_report_tokens=8, **spec).run([agent] * 2, docs, agent, "Where is Ada?")
        assert len(agent.calls) == before, spec


def test_report_kinds_have_a_turn_for_held_reads():
    from latentwire.protocols.text import REPORT_PROMPTS, REPORT_TURNS

    assert REPORT_TURNS.keys() == REPORT_PROMPTS.keys()


def test_kv_and_rows_senders_on_gemma3_keep_separate_reads_in_one_block(agent_for):
    """A kv sender's full-history read is its own entry: the rows sender in the same block still gets the
    windowed read, and each is charged the read it used."""
    agent = agent_for("gemma3")
    docs, q = ["The blue crate holds 58 bolts. The red crate holds 12 nails. Ada is here today."], "How many bolts?"
    with shared_reads() as memo:
        rows = get_protocol("cacheback", ratio=2, latent_steps=1, max_new_tokens=1).run([agent], docs, agent, q)
        kv = get_protocol("cacheback", ratio=2, latent_steps=1, max_new_tokens=1, encoding="kv").run(
            [agent], docs, agent, q)
        states = [v[0] for k, v in memo.items() if k[0] != "index"]  # not CacheBack's document layouts
    assert len(states) == 4 and _prefills(agent) == 2  # a windowed and a full-history prefill, each with its G = 1
    window = agent.geometry.sliding_window
    held_rows = sorted({len(s.layers[0].positions) for s in states})  # layer 0 is a sliding layer
    assert held_rows[0] == window - 1 and held_rows[-1] == len(states[-1])
    assert not rows.details["senders"][0]["shared_read"] and not kv.details["senders"][0]["shared_read"]


def test_held_keys_name_documents_by_digest_not_by_a_copy(agent_for):
    """A held read, report or retriever index is keyed by its prompt's SHA-256: no key holds the document, and a
    different document (one character apart) is a different entry."""
    agent = agent_for("llama")
    docs = ["Ada led Orion in Lisbon. " * 8, "Ada led Orion in Lisboa. " * 8]
    held = HeldReads()
    with shared_reads(held):
        for name, kw in [("text", {"read": "held", "max_report_tokens": 3}), ("retrieval", {"read": "held"})]:
            get_protocol(name, max_new_tokens=1, **kw).run([agent] * 2, docs, agent, "Where did Ada lead Orion?")
    kinds = sorted({k[0] if k[0] in ("report", "index") else "read" for k in held.memo})
    assert kinds == ["index", "read", "report"]
    parts = [p for k in held.memo for p in k if isinstance(p, str)]
    assert not any("Orion" in p for p in parts) and sum(p.startswith("sha256:") for p in parts) >= 6
    assert held.reads_computed == 2 and held.indexes_computed == 2  # one per document: the digests differ


def test_cacheback_layouts_are_held_apart_where_they_differ(agent_for):
    """One held layout per (agent, state length, span mode, span, prompt, document): settings that change which rows
    hold the document or how they group get their own, settings that do not share one; each equals a cold one."""
    agent = agent_for("llama")
    docs, q = ["Ada led Orion in Lisbon. Bo led Vega in Oslo."], "Where did Ada lead Orion?"
    held = HeldReads()
    specs = [dict(latent_steps=1), dict(latent_steps=1, ratio=2), dict(latent_steps=1, selector="lexical"),  # shared
             dict(latent_steps=0), dict(latent_steps=1, span_mode="fixed"), dict(latent_steps=1, query_aware=True)]
    with shared_reads(held):
        for spec in specs:
            get_protocol("cacheback", **({"ratio": 4, "max_new_tokens": 1} | spec)).run([agent], docs, agent, q)
    layouts = {k: v[0] for k, v in held.memo.items() if k[:2] == ("index", "layout")}
    assert held.indexes_computed == len(layouts) == 4  # G = 1 sentences (3 specs), G = 0, fixed spans, query-aware
    for key, (per_row, eligible, groups) in layouts.items():
        n_rows, units = key[3], key[4]  # the units stage's name: "sentences" or "spans"
        proto = get_protocol("cacheback", latent_steps=1, units=units)
        aware = get_protocol("cacheback", latent_steps=1, query_aware=True)
        prompt = next(p for p in (proto.sender_prompt(docs[0]), aware.sender_prompt(docs[0], q))
                      if text_key(p) == key[6])
        cold = proto.layout(agent, docs[0], n_rows, prompt)
        assert cold[0] == per_row and torch.equal(cold[1], eligible) and cold[2] == groups
