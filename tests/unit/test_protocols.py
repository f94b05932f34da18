"""Protocol registry, hyper-parameter validation, and what each protocol puts on the wire."""
import math

import pytest

from latentwire.agent import Agent
from latentwire.errors import UnknownNameError
from latentwire.protocols import PROTOCOLS, Outcome, get_protocol
from latentwire.protocols.base import QUESTION_SUFFIX, SENDER_PROMPT
from latentwire.protocols.fullkv import FullKV
from latentwire.protocols.text import Text

DOCS = ["The cat is called Tom.", "Tom lives in Paris, near the river."]
QUESTION = "Where does the cat live?"


@pytest.fixture
def agents(models, tokenizer):
    """Two senders and a receiver, all distinct Agent objects over the tiny llama."""
    return [Agent(models["llama"], tokenizer, model_name="llama") for _ in range(3)]


def test_registry():
    assert {"alone", "fullkv", "text"} <= set(PROTOCOLS)
    with pytest.raises(UnknownNameError) as e:
        get_protocol("nope")
    assert all(name in str(e.value) for name in ("alone", "fullkv", "text", "nope"))
    assert isinstance(get_protocol("fullkv", latent_steps=3), FullKV)


def test_fullkv_validates_parameters():
    with pytest.raises(ValueError):
        FullKV(latent_steps=-1)
    with pytest.raises(UnknownNameError) as e:
        FullKV(latent_mode="x")
    assert "realign" in str(e.value) and "rescale" in str(e.value)
    with pytest.raises(ValueError):
        FullKV(max_new_tokens=0)
    with pytest.raises(ValueError):
        Text(max_report_tokens=0)


def test_fullkv_zero_steps_still_sends_prefill_states(agents):
    *senders, receiver = agents
    out = FullKV(latent_steps=0, max_new_tokens=3).run(senders, DOCS, receiver, QUESTION)
    assert isinstance(out, Outcome) and out.protocol == "fullkv"
    prefill_rows = []
    for sender, doc in zip(senders, DOCS):
        (rec,) = [c for c in sender.calls if c.op == "prefill"]
        prefill_rows.append(rec.rows_in)
        ids = sender.chat_ids(SENDER_PROMPT.format(document=doc))  # query-blind by default
        assert rec.rows_in == len(ids)
    assert out.details["message_rows"] == sum(prefill_rows) and out.details["latent_steps"] == 0
    aware = FullKV(latent_steps=0, query_aware=True).sender_prompt(DOCS[0], QUESTION)
    assert aware == SENDER_PROMPT.format(document=DOCS[0]) + QUESTION_SUFFIX.format(question=QUESTION)
    # what crossed the wire: each sender's own canonical state bytes
    fresh = [FullKV(latent_steps=0).sender_state(s, d, QUESTION) for s, d in zip(senders, DOCS)]
    assert out.message_bytes == sum(len(s.to_bytes()) for s in fresh) > 0
    answer = receiver.calls[-1]  # the receiver's context: every message row, its continuation prompt, the answer
    assert out.receiver_context == answer.rows_in + answer.tokens_out and answer.rows_in > sum(prefill_rows)
    assert len(out.sender_seconds) == 2 and out.tteoa == max(out.sender_seconds) + out.receiver_seconds


def test_fullkv_latent_steps_add_rows(agents):
    *senders, receiver = agents
    out = FullKV(latent_steps=2, max_new_tokens=2).run(senders, DOCS, receiver, QUESTION)
    prefill_rows = sum(c.rows_in for s in senders for c in s.calls if c.op == "prefill")
    assert out.details["message_rows"] == prefill_rows + 2 * 2


def test_fullkv_mismatched_senders_and_documents(agents):
    with pytest.raises(ValueError):
        FullKV(latent_steps=0).run(agents[:1], DOCS, agents[2], QUESTION)


def test_text_protocol_bytes_are_the_reports(models, tokenizer):
    # tiny gemma3: its greedy reports are non-empty (the tiny llama's decode to whitespace only)
    *senders, receiver = [Agent(models["gemma3"], tokenizer, model_name="gemma3") for _ in range(3)]
    out = Text(max_report_tokens=12, max_new_tokens=3).run(senders, DOCS, receiver, QUESTION)
    reports = out.details["reports"]
    assert len(reports) == 2 and any(reports)
    assert out.message_bytes == len("\n".join(reports).encode("utf-8"))
    assert receiver.calls[-1].op == "answer" and out.receiver_context == receiver.calls[-1].context


def test_text_at_cacheback_size_budgets_each_report_by_its_document(models, tokenizer):
    *senders, receiver = [Agent(models["gemma3"], tokenizer, model_name="gemma3") for _ in range(3)]
    out = Text(ratio=4, max_new_tokens=2).run(senders, DOCS, receiver, QUESTION)
    want = [math.ceil(len(s.chat_ids(SENDER_PROMPT.format(document=d))) / 4) for s, d in zip(senders, DOCS)]
    assert out.details["report_budgets"] == want
    assert all(0 < used <= b for used, b in zip(out.details["report_tokens"], want))
    from latentwire.errors import ConfigError
    from latentwire.select import fanin_budget

    for bad in (0.5, float("nan"), float("inf")):  # NaN was an untyped ValueError inside check_window; inf a 0 budget
        with pytest.raises(ConfigError, match="finite number"):
            Text(ratio=bad)
    T = len(senders[0].chat_ids(SENDER_PROMPT.format(document=DOCS[0])))
    assert Text(ratio=1.4).report_budget(senders[0], DOCS[0]) == fanin_budget(T, 1.4)  # exact, as CacheBack's


def test_text_report_kinds(agents):
    from latentwire.protocols.text import REPORT_PROMPTS

    *senders, receiver = agents
    Text(report="notes", max_report_tokens=1, max_new_tokens=1).run(senders, DOCS, receiver, QUESTION)
    want = len(senders[0].chat_ids(REPORT_PROMPTS["notes"].format(document=DOCS[0], question=QUESTION)))
    assert senders[0].calls[0].rows_in == want
    with pytest.raises(UnknownNameError, match="quote"):
        get_protocol("text", report="essay")


def test_fullcontext_reads_every_document_in_one_prompt(agents):
    from latentwire.protocols.fullcontext import CONTEXT_PROMPT

    *senders, receiver = agents
    out = get_protocol("fullcontext", max_new_tokens=2).run(senders, DOCS, receiver, QUESTION)
    joined = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(DOCS))
    prompt = CONTEXT_PROMPT.format(documents=joined, question=QUESTION)
    assert receiver.calls[-1].rows_in == len(receiver.chat_ids(prompt))
    assert out.sender_seconds == () and out.message_bytes == len(joined.encode())
    assert out.kept_spans == tuple(((0, len(d)),) for d in DOCS)
    assert all(not s.calls for s in senders if s is not receiver)  # no sender ran


def test_alone_sends_nothing(agents):
    out = get_protocol("alone", max_new_tokens=2).run([], [], agents[2], QUESTION)
    assert out.message_bytes == 0 and out.sender_seconds == ()
    assert agents[2].calls[-1].rows_in == len(agents[2].chat_ids(QUESTION))


@pytest.mark.parametrize("name, params, keys", [
    ("fullkv", {"latent_steps": 2}, {"sender_rows", "latent_rows", "prompt", "max_new_tokens"}),
    ("cacheback", {"ratio": 4, "latent_steps": 2}, {"budget_rows", "first_rows", "latent_rows", "prompt",
                                                     "max_new_tokens"}),
])
def test_receiver_overflow_is_raised_before_any_sender_reads(models, tokenizer, monkeypatch, name, params, keys):
    from latentwire.errors import ContextOverflowError

    senders = [Agent(models["llama"], tokenizer, model_name="llama") for _ in range(2)]
    receiver = Agent(models["llama"], tokenizer, model_name="llama", context_window=64)
    reads = []
    monkeypatch.setattr(Agent, "prefill", lambda self, *a, **kw: reads.append(self) or pytest.fail("a sender read"))
    with pytest.raises(ContextOverflowError) as e:
        get_protocol(name, **params).run(senders, DOCS, receiver, QUESTION)
    assert reads == [] and e.value.window == 64 and set(e.value.breakdown) == keys
    assert e.value.needed == sum(e.value.breakdown.values()) > 64
    assert e.value.breakdown["latent_rows"] == 2 * 2


def test_sender_overflow_is_raised_before_any_sender_reads(models, tokenizer, monkeypatch):
    from latentwire.errors import ContextOverflowError

    senders = [Agent(models["llama"], tokenizer, model_name="llama", context_window=w) for w in (1000, 20)]
    receiver = Agent(models["llama"], tokenizer, model_name="llama")
    monkeypatch.setattr(Agent, "prefill", lambda self, *a, **kw: pytest.fail("a sender read"))
    for name in ("fullkv", "cacheback"):
        with pytest.raises(ContextOverflowError, match=r"sender 1 \(llama\) prompt"):
            get_protocol(name, latent_steps=1).run(senders, DOCS, receiver, QUESTION)


@pytest.mark.parametrize("ratio", [1, 4])
def test_window_check_bounds_the_message(agents, ratio):
    """The pre-check's message size is never below what CacheBack then sends; full KV's is exact."""
    from latentwire.errors import ContextOverflowError

    *senders, receiver = agents
    for proto in (get_protocol("cacheback", ratio=ratio, latent_steps=2, max_new_tokens=1),
                  get_protocol("fullkv", latent_steps=2, max_new_tokens=1)):
        sent = proto.run(senders, DOCS, receiver, QUESTION).details["message_rows"]
        small = Agent(receiver.model, receiver.tokenizer, "llama", context_window=1)
        with pytest.raises(ContextOverflowError) as e:
            proto.check_window(senders, DOCS, small, QUESTION)
        bound = e.value.needed - e.value.breakdown["prompt"] - e.value.breakdown["max_new_tokens"]
        assert sent <= bound and (proto.name == "cacheback" or sent == bound)


@pytest.mark.parametrize("name", ["text", "fullcontext", "fullkv", "cacheback", "retrieval", "cacheback_x", "merge"])
def test_no_documents_is_one_typed_error_before_any_compute(agent_for, name):
    from latentwire.errors import ConfigError

    agent = agent_for("llama")
    with pytest.raises(ConfigError, match="no documents"):
        get_protocol(name).run([], [], agent, "Where?")
    with pytest.raises(ConfigError, match="one document per sender"):
        get_protocol(name).run([agent], ["a", "b"], agent, "Where?")
    assert not agent.calls  # nothing ran
