"""The LangGraph node, with the real `langgraph` package and its in-memory checkpointer, on tiny models: the graph
state is JSON, a follow-up by handle reuses the held reads, the answer is the protocol's own, errors are typed."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from latentwire.agent import Agent
from latentwire.errors import ConfigError, UnknownNameError
from latentwire.integrations.langgraph import FaninState, fanin_node, handle
from latentwire.protocols import get_protocol
from latentwire.transport import AgentSpec, InProcessTransport

DOCS = {"a": "The access code of the north warehouse is 7341. The lights were replaced.",
        "b": "Maria Lopez leads the Falcon project, which is based in Lisbon.",
        "c": "The blue crate contains exactly 58 copper bolts."}
SPEC = "cacheback(ratio=4, latent_steps=1, max_new_tokens=4)"


@pytest.fixture
def agents(models, tokenizer):
    agent = Agent(models["qwen2"], tokenizer, "qwen2")
    return {"a": agent, "b": agent, "c": agent, "r": agent}


def _app(node, asynchronous: bool = False):
    graph = StateGraph(FaninState)
    graph.add_node("fanin", node.ainvoke if asynchronous else node)
    graph.add_edge(START, "fanin")
    graph.add_edge("fanin", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_a_graph_answers_as_the_protocol_and_a_follow_up_by_handle_reads_nothing(agents):
    node = fanin_node(SPEC, agents, receiver="r")
    app, thread = _app(node), {"configurable": {"thread_id": "t"}}
    first = app.invoke({"question": "Which city?", "documents": DOCS}, thread)
    cold = get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=4).run(
        [agents[s] for s in DOCS], list(DOCS.values()), agents["r"], "Which city?")
    assert first["answer"] == cold.answer
    meta = first["latentwire"]
    assert meta["message_bytes"] == cold.message_bytes and meta["receiver_context"] == cold.receiver_context
    assert meta["reads_computed"] == 6 and meta["held_reads"] == 0  # 3 prefills + 3 latent-step runs
    assert set(meta["kept_spans"]) == set(DOCS) and meta["senders"] == list(DOCS) and meta["receiver"] == "r"
    assert first["reads"] == {s: handle(s, "qwen2", str(agents[s].dtype), d) for s, d in DOCS.items()}
    # the follow-up names no document: the senders come from the checkpointed handles, their reads are held
    second = app.invoke({"question": "How many bolts?", "documents": {}}, thread)
    again = get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=4).run(
        [agents[s] for s in DOCS], list(DOCS.values()), agents["r"], "How many bolts?")
    assert second["answer"] == again.answer and second["reads"] == first["reads"]
    assert second["latentwire"]["reads_computed"] == 0 and second["latentwire"]["held_reads"] == 3
    json.dumps(app.get_state(thread).values)  # the checkpointed state is plain JSON


def test_a_held_retriever_builds_its_indexes_once_and_reports_question_time(agents):
    node = fanin_node("retrieval(selector='bm25', ratio=4, read='held', max_new_tokens=4)", agents, receiver="r")
    app, thread = _app(node), {"configurable": {"thread_id": "t"}}
    first = app.invoke({"question": "Which city?", "documents": DOCS}, thread)["latentwire"]
    second = app.invoke({"question": "How many bolts?", "documents": {}}, thread)["latentwire"]
    assert (first["indexes_computed"], second["indexes_computed"]) == (3, 0)  # one per document, then held
    assert (first["held_indexes"], second["held_indexes"]) == (0, 3)
    assert first["reads_computed"] == second["reads_computed"] == 0  # no sender LLM runs
    assert first["tteoa_question"] < first["tteoa"] and second["tteoa_question"] == pytest.approx(second["tteoa"])
    cold = get_protocol("retrieval", selector="bm25", ratio=4, max_new_tokens=4).run(
        [agents[s] for s in DOCS], list(DOCS.values()), agents["r"], "How many bolts?")  # what the index served
    assert second["kept_spans"] == {s: [list(x) for x in k] for s, k in zip(DOCS, cold.kept_spans)}
    assert second["senders"] == list(DOCS) and second["message_bytes"] == cold.message_bytes


def test_async_graphs_and_transports_run_the_same_step(agents, models, tokenizer):
    node = fanin_node(SPEC, agents, receiver="r")
    out = asyncio.run(_app(node, asynchronous=True).ainvoke({"question": "Which city?", "documents": DOCS},
                                                             {"configurable": {"thread_id": "x"}}))
    assert out["answer"] == node({"question": "Which city?", "documents": DOCS})["answer"]
    with InProcessTransport() as t:
        for name in ("a", "b", "r"):
            t.add(name, AgentSpec.tiny("qwen2"))
        via = fanin_node(SPEC, transport=t, receiver="r")({"question": "Which city?",
                                                            "documents": {"a": DOCS["a"], "b": DOCS["b"]}})
    assert via["latentwire"]["reads_computed"] is None and via["latentwire"]["message_bytes"] > 0
    assert isinstance(via["answer"], str) and set(via["reads"]) == {"a", "b"}


def test_bad_graph_state_and_bad_nodes_get_typed_errors(agents):
    node = fanin_node(SPEC, agents, receiver="r")
    with pytest.raises(ConfigError, match="question"):
        node({"documents": DOCS})
    with pytest.raises(ConfigError, match="no senders"):
        node({"question": "Q?"})
    with pytest.raises(UnknownNameError, match="valid: a, b, c, r"):
        node({"question": "Q?", "documents": {"zed": "text"}})
    with pytest.raises(ConfigError, match="not held here"):
        node({"question": "Q?", "reads": {"a": "a:00000000000000000000"}})
    with pytest.raises(ConfigError, match="must map sender names"):
        node({"question": "Q?", "documents": ["a list, not a mapping"]})
    with pytest.raises(ConfigError, match="string"):
        node({"question": "Q?", "documents": {"a": 3}})
    with pytest.raises(ConfigError, match="no receiver"):
        fanin_node(SPEC, agents)({"question": "Q?", "documents": DOCS})
    with pytest.raises(UnknownNameError, match="cacheback"):
        fanin_node("cacheback_chain", agents)
    with pytest.raises(ConfigError, match="one protocol"):
        fanin_node("text,fullkv", agents)
    with pytest.raises(ConfigError, match="not both"):
        fanin_node(SPEC, agents, transport=InProcessTransport())
    for name in ("text", "retrieval"):  # in process only: refused when built, not at every graph step
        with pytest.raises(ConfigError, match="no distributed runner"):
            fanin_node(name, transport=InProcessTransport(), receiver="r")
    for bad in (-1, True, 1.5):  # a byte bound is a whole number ≥ 0 (2e9 is one)
        with pytest.raises(ConfigError, match="max_bytes"):
            fanin_node(SPEC, agents, receiver="r", max_held_bytes=bad)
    assert fanin_node(SPEC, agents, receiver="r", max_held_bytes=2e9).held.max_bytes == 2 * 10**9
    with pytest.raises(UnknownNameError, match="valid: a, b, c, r"):  # at construction, not at the first step
        fanin_node(SPEC, agents, receiver="zzz")
    with pytest.raises(ConfigError, match="latentwire Agents"):
        fanin_node(SPEC, {"a": "smollm2-135m"}, receiver="a")
    with pytest.raises(ConfigError, match="mapping"):
        node(["Q?"])
    with pytest.raises(ConfigError, match="read handle of 'a' must be a string"):
        node({"question": "Q?", "reads": {"a": ["x"]}})
    node({"question": "Q?", "documents": DOCS})
    node.release()  # dropped: a handle alone is refused again, with the way out
    with pytest.raises(ConfigError, match="put its document"):
        node({"question": "Q?", "reads": {"a": handle("a", "qwen2", str(torch.float32), DOCS["a"])}})


def test_a_follow_up_keeps_the_fan_in_order_and_senders_choose_exactly(agents):
    """Senders come in the order the earlier step wrote `reads` (a new document for one of them does not move it);
    `senders` picks and orders them exactly; a handle names its own sender."""
    node = fanin_node(SPEC, agents, receiver="r")
    first = node({"question": "Which city?", "documents": DOCS})
    new_c = "The red crate contains exactly 12 brass nails."
    again = node({"question": "Which city?", "documents": {"c": new_c}, "reads": first["reads"]})
    assert again["latentwire"]["senders"] == ["a", "b", "c"] and again["reads"]["c"] != first["reads"]["c"]
    assert again["latentwire"]["held_reads"] == 2  # a and b held, c read afresh
    two = node({"question": "Which city?", "reads": first["reads"], "senders": ["b", "a"]})
    assert two["latentwire"]["senders"] == ["b", "a"] and set(two["reads"]) == {"a", "b"}
    for bad in (["a", "a"], "a", ["zed"]):
        with pytest.raises(ConfigError, match="senders"):
            node({"question": "Q?", "reads": first["reads"], "senders": bad})
    with pytest.raises(ConfigError, match="is not 'a''s"):
        node({"question": "Q?", "reads": {"a": first["reads"]["b"]}})
    with pytest.raises(ConfigError, match="must map names"):
        fanin_node(SPEC, [agents["a"], agents["r"]])


def test_concurrent_steps_run_one_at_a_time(agents):
    """Two graph requests on one node at once (ainvoke from a server): the steps do not interleave."""
    import threading
    import time

    node = fanin_node(SPEC, agents, receiver="r")
    real, inside, most = node.protocol, [0], [0]

    class Spy:
        def run(self, *args):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            try:
                return real.run(*args)
            finally:
                inside[0] -= 1

    node.protocol = Spy()
    answers = []
    step = lambda: answers.append(node({"question": "Which city?", "documents": DOCS})["answer"])  # noqa: E731
    threads = [threading.Thread(target=step) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and len(answers) == 3 and len(set(answers)) == 1
