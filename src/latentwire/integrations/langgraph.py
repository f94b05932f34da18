"""latentwire as a LangGraph node: one fan-in protocol among agents the node holds; the graph state is JSON only.

    node = fanin_node("cacheback(ratio=8)", {"ann": a, "ben": b, "cy": c, "reader": r}, receiver="reader")
    graph.add_node("fanin", node)          # a LangGraph node is a function: state -> partial update
    graph.add_node("fanin", node.ainvoke)  # in an async graph (the compute runs in a worker thread)

State the node reads (plain JSON, so any LangGraph checkpointer can store it):
    question   str, required
    documents  {sender name: text}; a sender may instead be named by a handle in `reads`
    reads      {sender name: handle} written by an earlier step: the sender holds that document's read
    senders    [sender name, ...], optional: exactly these senders, in this fan-in order (default: the senders of
               `reads`, in the order the earlier step wrote them, then those only in `documents`)
    receiver   str, optional (default: the node's)
It writes `answer` (str), `reads` (the handles of what the senders now hold) and `latentwire`: the outcome's
metadata (protocol, message bytes, receiver context, TTEOA, per-sender seconds, kept character spans, held
reads reused, wall seconds).

What stays in the agents: models, KV states and messages. In process (no `transport`) the node keeps each
sender's read in a `HeldReads` (bounded by `max_held_bytes`, least recently used first): a follow-up question in
a later graph step, with the documents or only their handles, reuses the held states, so its seconds are
question-time (`latentwire.held_reads` counts the reads served held). Through a `transport` the agents live on
its nodes and every step reads afresh (held reads are an in-process feature for now).

A handle names one (sender, model, dtype, document); it is stable across processes, but the held state is not:
after a restart a handle without its document is refused (`ConfigError`), with the documents it simply reads
again. The node keeps each handle's document text (not its KV) until `release()`, so a handle whose read
`HeldReads` dropped still works: that sender reads its document again.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, TypedDict

from ..agent import Agent
from ..bench.runner import parse_protocols
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..protocols import Protocol, get_protocol
from ..protocols.reads import HeldReads, shared_reads
from ..transport import Transport, run_protocol
from ..transport.run import check_runner

class FaninState(TypedDict, total=False):
    """The graph-state keys the node reads and writes (use it as, or merge it into, your graph's schema)."""
    question: str
    documents: dict[str, str]
    reads: dict[str, str]
    senders: list[str]
    receiver: str
    answer: str
    latentwire: dict


_LOCKS: "weakref.WeakKeyDictionary[object, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _holding(resources) -> Any:
    """Hold one lock per shared resource (an Agent, a Transport) for a step: nodes that share agents or a transport
    step one at a time (neither is thread-safe: a transport's replicas, an agent's caches and timing), while nodes
    that share nothing run concurrently. Locks are taken in one global order, so two nodes never deadlock."""
    with _LOCKS_GUARD:
        locks = [_LOCKS.setdefault(r, threading.RLock()) for r in sorted(set(resources), key=id)]
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


FANIN = ("text", "retrieval", "cacheback", "cacheback_x", "fullkv", "fullcontext", "merge", "packllm", "alone")


def handle(sender: str, agent_model: str, dtype: str, document: str) -> str:
    """The stable name of one sender's read of one document: `sender:<20 hex>`."""
    digest = hashlib.sha256("\0".join((sender, agent_model, dtype, document)).encode()).hexdigest()[:20]
    return f"{sender}:{digest}"


def _protocol(spec: Protocol | str) -> Protocol:
    if isinstance(spec, Protocol):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"protocol must be a Protocol or a spec string like 'cacheback(ratio=8)', got {spec!r}")
    parsed = parse_protocols(spec)
    if len(parsed) != 1:
        raise ConfigError(f"one protocol per node, got {len(parsed)} in {spec!r}")
    name, params = next(iter(parsed.values()))
    if name not in FANIN:
        raise UnknownNameError("fan-in protocol", name, FANIN)
    return get_protocol(name, **params)


@dataclass
class FaninNode:
    """A LangGraph node running `protocol` among `agents` (name -> Agent, in process) or on `transport`'s nodes."""
    protocol: Protocol
    agents: Mapping[str, Agent] = field(default_factory=dict)
    receiver: str | None = None
    transport: Transport | None = None
    max_held_bytes: int = 4 * 2**30
    held: HeldReads = field(init=False, repr=False)
    _documents: dict = field(init=False, repr=False, default_factory=dict)  # handle -> document text
    # one step at a time: concurrent steps (ainvoke from several requests) would interleave the held reads; other
    # nodes sharing its agents or transport wait too (`_holding`)
    _lock: threading.Lock = field(init=False, repr=False, compare=False, default_factory=threading.Lock)

    def __post_init__(self):
        if self.transport is None and not self.agents:
            raise ConfigError("a fan-in node needs agents (name -> Agent) or a transport whose nodes hold them")
        if self.transport is not None and self.agents:
            raise ConfigError("give agents or a transport, not both: through a transport the agents live on its nodes")
        if not isinstance(self.agents, Mapping):
            raise ConfigError(f"agents must map names to latentwire Agents, got {type(self.agents).__name__}")
        if bad := sorted({type(a).__name__ for a in self.agents.values() if not isinstance(a, Agent)}):
            raise ConfigError(f"agents must map names to latentwire Agents (Agent.from_pretrained(...)), got "
                              f"{', '.join(bad)}")
        if self.transport is not None:
            check_runner(self.protocol)  # text, retrieval, ... run in process only: refused now, not at every step
        if self.receiver is not None and self.transport is None and self.receiver not in self.agents:
            raise UnknownNameError("receiver agent", str(self.receiver), tuple(self.agents))
        self.held = HeldReads(self.max_held_bytes)

    # -- the node ---------------------------------------------------------------------------------
    def __call__(self, state: Mapping[str, Any]) -> dict:
        shared = [self.transport] if self.transport is not None else list(self.agents.values())
        with self._lock, _holding(shared):
            return self._step(state)

    @property
    def _devices(self) -> set:
        """The in-process agents' devices, whose queued work the step's wall clock waits for (none through a
        transport: its nodes' replies have arrived when it returns)."""
        return {a.device for a in self.agents.values()}

    def _step(self, state: Mapping[str, Any]) -> dict:
        question, senders, documents, receiver = self._inputs(state)
        t0 = now(*self._devices)
        computed = served = indexes = held_indexes = None
        if self.transport is None:
            before = (self.held.reads_computed, self.held.served_held, self.held.indexes_computed,
                      self.held.indexes_served_held)
            with shared_reads(self.held):
                out = self.protocol.run([self.agents[s] for s in senders], documents, self.agents[receiver], question)
            computed, served = self.held.reads_computed - before[0], self.held.served_held - before[1]
            indexes, held_indexes = self.held.indexes_computed - before[2], self.held.indexes_served_held - before[3]
        else:
            out = run_protocol(self.transport, self.protocol, senders, documents, receiver, question)
        wall = now(*self._devices) - t0
        handles = {s: self._hold(s, d) for s, d in zip(senders, documents)}
        meta = {"protocol": out.protocol, "message_bytes": out.message_bytes, "receiver_context": out.receiver_context,
                "tteoa": out.tteoa, "tteoa_question": out.question_tteoa, "sender_seconds": list(out.sender_seconds),
                "receiver_seconds": out.receiver_seconds, "wall_seconds": wall, "senders": senders,
                "receiver": receiver, "reads_computed": computed,
                "held_reads": served, "indexes_computed": indexes, "held_indexes": held_indexes,
                "held_bytes": None if self.transport else self.held.nbytes,
                "kept_spans": None if out.kept_spans is None else {
                    s: [list(span) for span in spans] for s, spans in zip(senders, out.kept_spans)}}
        return {"answer": out.answer, "reads": handles, "latentwire": meta}

    async def ainvoke(self, state: Mapping[str, Any]) -> dict:
        """The node for async graphs: the same step in a worker thread (torch releases the GIL while it computes)."""
        return await asyncio.to_thread(self, state)

    def release(self) -> None:
        """Drop every held read (the handles in graph states then need their documents again)."""
        with self._lock:
            self.held.release()
            self._documents.clear()

    # -- helpers ----------------------------------------------------------------------------------
    def _inputs(self, state: Mapping[str, Any]) -> tuple[str, list[str], list[str], str]:
        if not isinstance(state, Mapping):
            raise ConfigError(f"graph state must be a mapping (question, documents, reads), got {type(state).__name__}")
        question = state.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ConfigError("graph state needs 'question': a non-empty string")
        if not isinstance(state.get("documents") or {}, Mapping) or not isinstance(state.get("reads") or {}, Mapping):
            raise ConfigError("graph state 'documents' and 'reads' must map sender names to text / handles")
        documents = dict(state.get("documents") or {})
        reads = dict(state.get("reads") or {})
        if (senders := state.get("senders")) is not None:
            if not isinstance(senders, list) or not all(isinstance(s, str) for s in senders) \
                    or len(set(senders)) < len(senders):
                raise ConfigError(f"graph state 'senders' must be a list of distinct sender names, got {senders!r}")
            if missing := [s for s in senders if s not in documents and s not in reads]:
                raise ConfigError(f"senders {missing} have neither a document nor a read handle in the graph state")
        else:  # the earlier step's order (it wrote `reads` in fan-in order), then new senders
            senders = list(reads) + [s for s in documents if s not in reads]
        if not senders:
            raise ConfigError("graph state names no senders: give 'documents' ({sender: text}) or 'reads' handles")
        texts = []
        for s in senders:
            if s in documents:
                if not isinstance(documents[s], str):
                    raise ConfigError(f"document of {s!r} must be a string, got {type(documents[s]).__name__}")
                texts.append(documents[s])
            elif not isinstance(reads[s], str):
                raise ConfigError(f"read handle of {s!r} must be a string (as this node returned it), got "
                                  f"{type(reads[s]).__name__}")
            elif reads[s].rpartition(":")[0] != s:
                raise ConfigError(f"read handle {reads[s]!r} is not {s!r}'s (a handle names its sender first)")
            elif reads[s] in self._documents:
                texts.append(self._documents[reads[s]])
            else:
                raise ConfigError(f"sender {s!r}: handle {reads[s]!r} is not held here (released, or another "
                                  "process); put its document in 'documents' to read it again")
        receiver = state.get("receiver") or self.receiver
        if not isinstance(receiver, str):
            raise ConfigError("no receiver: give fanin_node(..., receiver=name) or 'receiver' in the graph state")
        names = self.transport.nodes if self.transport is not None else tuple(self.agents)
        for name in senders + [receiver]:
            if name not in names:
                raise UnknownNameError("agent", str(name), names)
        return question, senders, texts, receiver

    def _hold(self, sender: str, document: str) -> str:
        agent = self.agents.get(sender)
        model, dtype = (agent.model_name, str(agent.dtype)) if agent is not None else ("remote", "")
        h = handle(sender, model, dtype, document)
        self._documents[h] = document
        return h


def fanin_node(protocol: Protocol | str, agents: Mapping[str, Agent] | None = None, *, receiver: str | None = None,
               transport: Transport | None = None, max_held_bytes: int = 4 * 2**30) -> FaninNode:
    """A LangGraph node (a callable: state -> partial update) running one fan-in `protocol` (an object or a spec
    string such as "cacheback(ratio=8)") among `agents` in process, or on `transport`'s nodes."""
    if agents is not None and not isinstance(agents, Mapping):
        raise ConfigError(f"agents must map names to latentwire Agents ({{'ann': agent, ...}}), got "
                          f"{type(agents).__name__}")
    return FaninNode(_protocol(protocol), dict(agents or {}), receiver, transport, max_held_bytes)
