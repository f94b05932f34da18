"""A LangGraph graph with a latentwire fan-in node (pip install 'latentwire[langgraph]'): a router, CacheBack among
three senders, an answer step. The follow-up question carries no documents: the senders are named by the handles
of the reads they hold, so only the question is computed."""
import os

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from latentwire.agent import Agent
from latentwire.integrations.langgraph import FaninState, fanin_node

MODEL = os.environ.get("LATENTWIRE_EXAMPLE_MODEL", "qwen2.5-coder-0.5b")
agent = Agent.from_pretrained(MODEL)  # one Agent plays every sender and the receiver
agents = {"facilities": agent, "projects": agent, "inventory": agent, "reader": agent}
documents = {"facilities": "Facilities log. The access code of the north warehouse is 7341. The lobby lights were replaced.",
             "projects": "Project notes. Maria Lopez leads the Falcon project, which is based in Lisbon. Lunch is on Friday.",
             "inventory": "Inventory. The blue crate contains exactly 58 copper bolts. The forklift needs service in May."}


class State(FaninState, total=False):
    route: str
    reply: str


graph = StateGraph(State)
graph.add_node("route", lambda s: {"route": "fanin" if s.get("documents") or s.get("reads") else "none"})
graph.add_node("fanin", fanin_node("cacheback(ratio=4, max_new_tokens=16)", agents, receiver="reader"))
graph.add_node("answer", lambda s: {"reply": s["answer"].strip().split("\n")[0]})
graph.add_edge(START, "route")
graph.add_conditional_edges("route", lambda s: s["route"], {"fanin": "fanin", "none": END})
graph.add_edge("fanin", "answer")
graph.add_edge("answer", END)
app = graph.compile(checkpointer=InMemorySaver())  # graph state is JSON: documents, handles, metadata

thread = {"configurable": {"thread_id": "warehouse"}}
for update in ({"question": "Which city is the Falcon project based in?", "documents": documents},
               {"question": "How many copper bolts are in the blue crate?", "documents": {}}):  # by handle only
    state = app.invoke(update, thread)
    meta = state["latentwire"]
    print(f"{state['question']!r} -> {state['reply']!r}  ({meta['message_bytes']:,} bytes, TTEOA {meta['tteoa']:.2f} s, "
          f"{meta['reads_computed']} reads computed, {meta['held_reads']} held)")
