"""Run a protocol with its agents on a transport: senders compute where they live, messages travel as
the transport carries them, the receiver answers where it lives.

    outcome = run_protocol(t, get_protocol("cacheback", ratio=16), ["a", "b", "c"], docs, "r", question)

Supported: cacheback and cacheback_x (fan-in; cacheback_x's senders may hold another model than the
receiver: their messages are document spans, or K/V translated into the receiver's geometry), cacheback_chain,
fullkv and merge. Each step below does exactly what the protocol's own `run` does for one agent, so the
selected positions, the answer and the merge digest are the same on every transport
(tests/unit/test_transport.py checks in-process against Ray).

The Outcome is the protocol's own, plus transport details: `transport`, `positions` (per sender, as
the receiver read them from the message), `signed_by` (key ids of verified signatures), `wire_bytes`
(bytes that crossed, per sender; 0 by reference), `wall_s` (driver wall clock, dispatch to answer)
and `lost` (senders whose node died; see `on_lost`).
"""
from __future__ import annotations

import time
from dataclasses import fields
from typing import Callable, Sequence

from ..clock import now
from ..errors import ConfigError
from ..protocols.base import Outcome, Protocol
from .base import NodeLostError, Transport, key_id

ON_LOST = ("raise", "skip")


def protocol_spec(protocol: Protocol) -> tuple[str, dict]:
    """(name, init parameters): what a node needs to rebuild the same protocol object."""
    return protocol.name, {f.name: getattr(protocol, f.name) for f in fields(protocol) if f.init}


def _wire_len(packed) -> int:
    return len(packed) if isinstance(packed, (bytes, bytearray, memoryview)) else 0


def _received_info(got) -> dict:
    return {"positions": [None if g.positions is None else list(g.positions) for g in got],
            "signed_by": [key_id(g.signed_by) for g in got], "wire_bytes": [g.wire_bytes for g in got]}


def _answer_info(reply) -> dict:
    return {"answer": reply.text, "token_ids": list(reply.token_ids), "context": reply.context,
            "seconds": reply.seconds}


# -- steps (run where the node lives; module-level so Ray pickles them by reference) ----------------
def cacheback_send(node, spec, document: str, question: str, index: int = 0):
    """A CacheBack sender (cacheback, cacheback_x): read (prefill + latent steps), score against the query, send
    what the protocol sends for the best rows (`CacheBack.send_one`: rows; across models document spans, or K/V
    translated into the receiver's geometry)."""
    from ..message import Spans
    from ..select import fanin_budget
    from ..state import KVState
    from ..wire import Selection

    p, agent = node.protocol(*spec), node.agent
    sent = p.send_one(agent, document, question, index)
    t1 = now(agent.device)
    m = sent.part
    if isinstance(m, (Spans, KVState)):  # text for a receiver of any model, or K/V: the message names no rows
        packed, kept = node.pack(m, protocol=p.name), p.encoding.kept([m], (sent.kept,))[0]  # as `run` reports
    else:
        budget = fanin_budget(sent.timing["rows"], p.ratio)
        packed, kept = node.pack(m, protocol=p.name, positions=sent.positions,
                                 selection=Selection(p.selector, budget, p.ratio),
                                 encoding="token_ids" if p.encoding.name == "token_ids" else None), sent.kept
    info = {"seconds": sent.seconds, "timing": sent.timing, "kept": kept, "positions": sent.positions,
            "pack_s": now(agent.device) - t1, "wire_bytes": _wire_len(packed)}
    return packed, info


def fanin_answer(node, spec, question: str, *packed):
    """A fan-in receiver (cacheback, cacheback_x, fullkv): the senders' messages in sender order, then the answer.

    Rows (cacheback) are concatenated and Spans (cacheback_x) tokenised by this agent (`CacheBack.receive`),
    then re-prefilled in the receiver's template slot; KV states (fullkv, cacheback's K/V encodings,
    cacheback_x "translated") are concatenated along the sequence axis and answered over as the protocol's own
    `run` does (`CacheBack.reply`). `unpack_s` times decoding plus joining.
    """
    from ..protocols.cacheback import CacheBack
    from ..state import KVState

    p = node.protocol(*spec)
    t0 = now(node.agent.device)
    got = [node.unpack(m) for m in packed]
    bodies = [g.body for g in got]
    message = p.receive(node.agent, question, bodies) if isinstance(p, CacheBack) else KVState.concat(bodies)
    unpack_s = now(node.agent.device) - t0
    reply = p.reply(node.agent, question, message) if isinstance(p, CacheBack) else \
        node.agent.answer(question, message=message, max_new_tokens=p.max_new_tokens)
    out = _answer_info(reply) | _received_info(got) | {"unpack_s": unpack_s, "message_rows": len(message)}
    if isinstance(p, CacheBack):  # bytes and details as the protocol's own `run` counts them (its encoding stage)
        nbytes, cost = p.encoding.cost(bodies, message)
        out |= {"nbytes": nbytes, "cost": cost}
    return out


def reader_plan(node, spec, document: str, question: str) -> dict:
    """On a reader's node, before it reads: its Geometry (what a latent map or translator is checked against),
    its model name and the length of the prompt it will read (what bounds its message); its read (and a
    re-encoding re-read) fit its own window."""
    from ..protocols.cacheback import CacheBack

    agent, p = node.agent, node.protocol(*spec)
    (prompt,) = p.check_senders([agent], [document], question)
    if isinstance(p, CacheBack):
        p.check_reread(agent, f"sender {node.name!r}", prompt, question)
    return {"geometry": agent.geometry, "model": agent.model_name, "prompt": prompt}


def check_readers(node, spec, plans: list[dict], question: str) -> None:
    """On the receiver's node, before any reader reads: cacheback_x's latent map or translator fits every reader
    and it, and ("translated") the largest message the readers' budgets allow fits its window; cacheback and
    fullkv: the largest message the readers' budgets allow, with the question and answer, fits its window."""
    from ..protocols.cacheback_x import CacheBackX

    p = node.protocol(*spec)
    prompts = [x["prompt"] for x in plans]
    if not isinstance(p, CacheBackX):
        p.check_receiver_window(prompts, node.agent, question)
        return
    p.check_map([x["geometry"] for x in plans], node.agent)
    if p.delivery == "translated":
        p.check_translated_window([x["model"] for x in plans], prompts, node.agent, question)


def fullkv_send(node, spec, document: str, question: str):
    p = node.protocol(*spec)
    t0 = now(node.agent.device)
    state = p.sender_state(node.agent, document, question)
    seconds = now(node.agent.device) - t0
    packed = node.pack(state, protocol=p.name)
    return packed, {"seconds": seconds, "nbytes": len(state.to_bytes()), "wire_bytes": _wire_len(packed)}


def merge_think(node, spec, document: str, question: str):
    """A merge thinker: its finished state becomes a fragment, kept in its replica and sent as a set of one."""
    from ..merge import Fragment, FragmentSet

    p = node.protocol(*spec)
    t0 = now(node.agent.device)
    fragment = Fragment.of(p.sender_state(node.agent, document, question))
    seconds = now(node.agent.device) - t0
    node.replica = node.replica.add(fragment)
    packed = node.pack(FragmentSet([fragment]), protocol=p.name)
    return packed, {"seconds": seconds, "digest": fragment.digest, "wire_bytes": _wire_len(packed)}


def merge_judge(node, spec, question: str, *packed):
    """The judger: merge the thinkers' fragments (`Merge.combine`: a duplicate counts once unless
    dedupe=False), render, answer (as Merge.run)."""
    p = node.protocol(*spec)
    got = [node.unpack(m) for m in packed]
    t0 = now(node.agent.device)
    fragments = [f for g in got for f in g.body]  # thinker order (one fragment per message)
    state, slots, merged = p.combine(fragments)
    node.replica = node.replica.merge(merged)
    render_s = now(node.agent.device) - t0
    reply = node.agent.answer(question, message=state, max_new_tokens=p.max_new_tokens)
    return _answer_info(reply) | _received_info(got) | {
        "render_s": render_s, "message_rows": len(state), "slots": slots, "digest": state.digest(),
        "fragments": len(merged), "nbytes": sum(len(fragments[i].state.to_bytes()) for i in slots)}


def chain_hop(node, spec, document: str, index: int, question: str, packed=None, previous=None):
    """One CacheBack chain hop: re-prefill the previous hop's rows (if any), read, select, send on."""
    p = node.protocol(*spec)
    t0 = now(node.agent.device)
    got = None if packed is None else node.unpack(packed)
    origins = [] if previous is None else previous["origins"]
    out, origins, info = p.hop(node.agent, document, index, question, None if got is None else got.body,
                               list(origins))
    seconds = now(node.agent.device) - t0
    sent = node.pack(out, protocol=p.name, encoding="token_ids" if p.encoding.name == "token_ids" else None)
    return sent, {"seconds": seconds, "origins": origins, "info": info, "wire_bytes": _wire_len(sent),
                  "signed_by": None if got is None else key_id(got.signed_by)}


def chain_answer(node, spec, question: str, packed):
    p = node.protocol(*spec)
    got = node.unpack(packed)
    reply = node.agent.answer(question, message=got.body, max_new_tokens=p.max_new_tokens)
    return _answer_info(reply) | _received_info([got]) | {
        "message_rows": len(got.body), "rows_bytes": got.body.nbytes, "token_id_bytes": got.body.token_id_nbytes}


def sleep_step(node, seconds: float) -> str:
    """Keep a node busy (tests: a step queued behind it cannot have run before a kill)."""
    time.sleep(seconds)
    return node.name


# -- the driver ------------------------------------------------------------------------------------
def run_protocol(transport: Transport, protocol: Protocol | tuple[str, dict], senders: Sequence[str],
                 documents: Sequence[str], receiver: str, question: str, *, on_lost: str = "raise",
                 after_dispatch: Callable[[], None] | None = None) -> Outcome:
    """Run one episode of `protocol` with senders and receiver on their nodes.

    on_lost: "raise" (NodeLostError naming the node) or "skip": a fan-in (cacheback, fullkv, merge)
      completes from the senders that survive, listing the lost ones in `details["lost"]`. A lost
      receiver, a lost chain hop, or losing every sender always raises NodeLostError.
    after_dispatch: called once every sender step is submitted (tests use it to kill a node mid-run).
    """
    from ..protocols import get_protocol
    from ..protocols.cacheback import CacheBack
    from ..protocols.cacheback_chain import CacheBackChain
    from ..protocols.cacheback_x import CacheBackX
    from ..protocols.fullkv import FullKV
    from ..protocols.merge import Merge

    if isinstance(protocol, tuple):
        protocol = get_protocol(protocol[0], **protocol[1])
    check_runner(protocol)
    if on_lost not in ON_LOST:
        raise ConfigError(f"on_lost: want one of {ON_LOST}, got {on_lost!r}")
    if len(senders) != len(documents):
        raise ConfigError(f"{len(senders)} senders for {len(documents)} documents: want one document per sender")
    if not senders:
        raise ConfigError("no senders: run_protocol needs at least one sender and its document")
    spec = protocol_spec(protocol)
    t0 = now()  # wall clock: the nodes' steps have returned (their clocks wait for their devices)
    if isinstance(protocol, CacheBackChain):
        out = _run_chain(transport, spec, senders, documents, receiver, question, after_dispatch)
    elif isinstance(protocol, (CacheBack, FullKV)):
        if isinstance(protocol, CacheBackX):
            if protocol.delivery in ("spans+latent", "translated"):  # spans: re-tokenised text, known only when sent
                _check_readers_first(transport, spec, senders, documents, receiver, question, on_lost)
        elif not isinstance(protocol, Merge):  # a merge's size depends on what it absorbs: known when it renders
            _check_readers_first(transport, spec, senders, documents, receiver, question, on_lost)
        kind = "merge" if isinstance(protocol, Merge) else "cacheback" if isinstance(protocol, CacheBack) else "fullkv"
        send, answer = {"cacheback": (cacheback_send, fanin_answer), "merge": (merge_think, merge_judge),
                        "fullkv": (fullkv_send, fanin_answer)}[kind]
        out = _run_fanin(transport, spec, kind, send, answer, senders, documents, receiver, question, on_lost,
                         after_dispatch)
    out.details["wall_s"] = now() - t0
    out.details["transport"] = transport.name
    return out


def check_runner(protocol) -> None:
    """ConfigError unless `run_protocol` has a distributed runner for `protocol` (asked before anything runs)."""
    from ..protocols.cacheback import CacheBack
    from ..protocols.cacheback_chain import CacheBackChain
    from ..protocols.fullkv import FullKV

    if not isinstance(protocol, (CacheBackChain, CacheBack, FullKV)):
        raise ConfigError(f"protocol {protocol.name!r} has no distributed runner; run_protocol supports "
                          "cacheback, cacheback_x, cacheback_chain, fullkv and merge")


def _check_readers_first(t: Transport, spec, senders, documents, receiver, question, on_lost) -> None:
    """A latent map or translator of another pair, or a message too long for a reader or the receiver, is refused
    (ContextOverflowError, as the protocol's own run refuses it) before any reader reads: every reader's plan (`reader_plan`, asked of all at once; a lost reader is left out
    under on_lost="skip", as the fan-in will leave it out), checked on the receiver, where the map lives."""
    handles = []
    for s, d in zip(senders, documents):
        try:
            handles.append(t.submit(s, reader_plan, spec, d, question))
        except NodeLostError:
            if on_lost == "raise":
                raise
    plans = []
    for h in handles:
        try:
            plans.append(t.get(h))
        except NodeLostError:
            if on_lost == "raise":
                raise
    t.run(receiver, check_readers, spec, plans, question)


def _run_fanin(t: Transport, spec, kind, send, answer, senders, documents, receiver, question, on_lost, after_dispatch):
    handles, lost = [], []
    for s, d in zip(senders, documents):
        try:
            args = (len(handles),) if kind == "cacheback" else ()  # a CacheBack sender's index in the fan-in
            handles.append(t.submit(s, send, spec, d, question, *args, n_out=2))
        except NodeLostError:
            if on_lost == "raise":
                raise
            handles.append(None)
    if after_dispatch is not None:
        after_dispatch()
    infos, messages = [], []
    for s, h in zip(senders, handles):
        try:
            if h is None:
                raise NodeLostError(s, "it was dead before the run")
            infos.append(t.get(h[1]))  # small; the message itself stays where the transport keeps it
            messages.append(h[0])
        except NodeLostError:
            if on_lost == "raise":
                raise
            lost.append(s)
            infos.append(None)
    if not messages:
        raise NodeLostError(",".join(lost), "every sender was lost")
    got = t.run(receiver, answer, spec, question, *messages)
    live = [i for i in infos if i is not None]
    details = {"lost": lost, "positions": got["positions"], "signed_by": got["signed_by"],
               "wire_bytes": got["wire_bytes"], "message_rows": got["message_rows"],
               "answer_token_ids": got["token_ids"]}
    kept = None
    if kind == "cacheback":
        nbytes = got["nbytes"]
        details |= got["cost"]
        details |= {"senders": [i["timing"] for i in live], "sent_positions": [i["positions"] for i in live]}
        kept = tuple(() if i is None else tuple(i["kept"]) for i in infos)
        receiver_s = got["seconds"] + got["unpack_s"]
    elif kind == "merge":
        nbytes = got["nbytes"]
        details |= {"slots": got["slots"], "digest": got["digest"], "fragments": got["fragments"],
                    "render_s": got["render_s"], "latent_steps": spec[1]["latent_steps"]}
        receiver_s = got["seconds"] + got["render_s"]
        kept = tuple(() if i is None else ((0, len(d)),) for i, d in zip(infos, documents))  # a lost sender: none
    else:
        nbytes = sum(i["nbytes"] for i in live)
        details |= {"latent_steps": spec[1]["latent_steps"]}
        receiver_s = got["seconds"] + got["unpack_s"]
        kept = tuple(() if i is None else ((0, len(d)),) for i, d in zip(infos, documents))
    return Outcome(spec[0], got["answer"], nbytes, got["context"], tuple(i["seconds"] for i in live), receiver_s,
                   details, kept_spans=kept)


def _run_chain(t: Transport, spec, senders, documents, receiver, question, after_dispatch):
    msg, info, infos = None, None, []
    for i, (s, d) in enumerate(zip(senders, documents)):  # pipelined: each hop reads the previous hop's handles
        msg, info = t.submit(s, chain_hop, spec, d, i, question, msg, info, n_out=2)
        infos.append(info)
    if after_dispatch is not None:
        after_dispatch()
    try:
        got = t.run(receiver, chain_answer, spec, question, msg)
    except NodeLostError:
        for s, info in zip(senders, infos):  # name the first hop that was lost (the rest failed after it)
            try:
                t.get(info)
            except NodeLostError as e:
                raise NodeLostError(s, e.reason) from None
        raise
    hops = t.get_all(infos)
    origins = hops[-1]["origins"]
    nbytes = got["rows_bytes"] if spec[1]["encoding"].name == "rows" else got["token_id_bytes"]
    kept = tuple(tuple(o[1] for o in origins if o and o[0] == k) for k in range(len(documents)))
    details = {"hops": [h["info"] for h in hops], "message_rows": got["message_rows"], "rows_bytes": got["rows_bytes"],
               "token_id_bytes": got["token_id_bytes"], "lost": [], "positions": got["positions"],
               "signed_by": [h["signed_by"] for h in hops[1:]] + got["signed_by"],
               "wire_bytes": [h["wire_bytes"] for h in hops], "answer_token_ids": got["token_ids"]}
    return Outcome(spec[0], got["answer"], nbytes, got["context"], (sum(h["seconds"] for h in hops),),
                   got["seconds"], details, kept_spans=kept)
