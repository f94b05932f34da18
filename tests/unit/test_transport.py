"""Transports: in-process and Ray give the same positions, answers and merge digests as
the protocols' own `run`; messages between Ray actors are signed wire bytes; replicas converge by
anti-entropy; a node killed mid-run is either skipped or reported as NodeLostError, and no surviving
replica loses a fragment.

Ray starts once for this module (num_cpus=2, no dashboard), with tiny gemma3 agents (tiny llama/qwen2
answer with an immediate stop token, which would make answer comparisons vacuous).
"""
from __future__ import annotations

import os

import pytest

from latentwire.agent import Agent
from latentwire.errors import ConfigError, ModelNotFoundError, UnknownNameError
from latentwire.merge import FragmentSet
from latentwire.protocols import get_protocol
from latentwire.transport import (AgentSpec, InProcessTransport, Node, NodeConfig, NodeLostError, anti_entropy,
                                  get_transport, key_id, run_protocol)
from latentwire.transport.replication import digests, replica_digests
from latentwire.transport.run import fanin_answer, merge_think, sleep_step
from latentwire.wire import SignatureError, WireFormatError, generate_key

ARCH = "gemma3"
DOCS = ("The secret access code for the north warehouse is 7341. Lights were replaced.",
        "Maria Lopez leads the Falcon project, which is based in Lisbon.",
        "The blue crate contains exactly 58 copper bolts. The forklift needs service.")
QUESTION = "What is the secret access code?"
SMALL = dict(latent_steps=2, max_new_tokens=4)
PROTOCOLS = {
    "cacheback": ("cacheback", dict(ratio=4.0, **SMALL)),
    "cacheback_token_ids": ("cacheback", dict(ratio=4.0, encoding="token_ids", **SMALL)),
    "fullkv": ("fullkv", SMALL),
    "merge": ("merge", SMALL),
    "merge_bag": ("merge", dict(render="bag", **SMALL)),
    "chain": ("cacheback_chain", dict(ratio=4.0, **SMALL)),
    "cacheback_x": ("cacheback_x", dict(ratio=4.0, **SMALL)),  # same model here; spans messages (no rows)
}
SENDERS, RECEIVER = ("sender-0", "sender-1"), "receiver"  # the names `latentwire serve` gives its agents
VICTIMS = ("v", "w")  # Ray nodes the kill tests kill


def _protocol(key):
    name, params = PROTOCOLS[key]
    return get_protocol(name, **params)


def _same(out, ref):
    """What must not depend on the transport."""
    assert out.protocol == ref.protocol
    assert out.answer == ref.answer
    assert out.receiver_context == ref.receiver_context
    assert out.message_bytes == ref.message_bytes
    assert out.kept_spans == ref.kept_spans
    assert out.details["message_rows"] == ref.details["message_rows"]
    for key in ("digest", "slots", "fragments"):
        if key in ref.details:
            assert out.details[key] == ref.details[key], key


@pytest.fixture(scope="module")
def local_agent(tokenizer):
    from latentwire.models import tiny_model

    return Agent(tiny_model(ARCH), tokenizer, model_name=ARCH)


@pytest.fixture(scope="module")
def reference(local_agent):
    """Each protocol's own run, all agents in one process (the ground truth)."""
    cache = {}

    def get(key, docs=DOCS[:2]):
        if (key, docs) not in cache:
            p = _protocol(key)
            cache[key, docs] = p.run([local_agent] * len(docs), list(docs), local_agent, QUESTION)
        return cache[key, docs]

    return get


@pytest.fixture(scope="module")
def zero_copy():
    t = InProcessTransport()
    for name in SENDERS + (RECEIVER,):
        t.add(name, AgentSpec.tiny(ARCH))
    yield t
    t.close()


@pytest.fixture(scope="module")
def ray_t():
    """One Ray for the module: 2 CPUs, no dashboard; two senders, a receiver and two victims, each an actor."""
    from latentwire.transport.ray_transport import RayTransport

    t = RayTransport(num_cpus=2, init_kwargs={"object_store_memory": 100 * 2**20})
    for name in SENDERS + (RECEIVER,) + VICTIMS:  # all actors start in parallel (victims: the kill tests)
        t.add(name, AgentSpec.tiny(ARCH))
    t.ready()
    yield t
    t.close()
    import ray

    assert not ray.is_initialized()


# -- in-process --------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(PROTOCOLS))
def test_inprocess_zero_copy_matches_protocol_run(zero_copy, reference, key):
    out = run_protocol(zero_copy, _protocol(key), list(SENDERS), list(DOCS[:2]), RECEIVER, QUESTION)
    _same(out, reference(key))
    assert out.details["transport"] == "inprocess"
    assert out.details["wire_bytes"] == [0] * len(out.details["wire_bytes"])  # passed by reference
    assert out.details["signed_by"] == [None] * len(out.details["signed_by"])
    if key in ("cacheback", "cacheback_token_ids"):  # rows name their positions; spans do not
        assert out.details["positions"] == out.details["sent_positions"]


@pytest.mark.parametrize("key", ["cacheback", "cacheback_token_ids", "fullkv", "merge", "chain", "cacheback_x"])
def test_inprocess_over_the_wire_signed_and_sealed(reference, key):
    with InProcessTransport(wire=True, sign=True, key=generate_key()) as t:
        for name in SENDERS + (RECEIVER,):
            t.add(name, AgentSpec.tiny(ARCH))
        out = run_protocol(t, _protocol(key), list(SENDERS), list(DOCS[:2]), RECEIVER, QUESTION)
        keys = {key_id(k) for k in t.public_keys().values()}
    _same(out, reference(key))
    assert all(w > 0 for w in out.details["wire_bytes"])
    assert set(out.details["signed_by"]) <= keys and None not in out.details["signed_by"]


def test_receiver_rejects_untrusted_unsigned_and_garbled_messages(tokenizer):
    t = InProcessTransport(sign=True)
    t.add("a", AgentSpec.tiny(ARCH))
    t.add("r", AgentSpec.tiny(ARCH))  # a local transport: its own names
    spec = ("cacheback", PROTOCOLS["cacheback"][1])
    outsider = Node("x", AgentSpec.tiny(ARCH), NodeConfig(wire=True, sign=True))  # a key r never trusted
    unsigned = Node("u", AgentSpec.tiny(ARCH), NodeConfig(wire=True))
    from latentwire.transport.run import cacheback_send

    for node, error in ((outsider, SignatureError), (unsigned, SignatureError)):
        packed, _ = cacheback_send(node, spec, DOCS[0], QUESTION)
        with pytest.raises(error):
            t.run("r", fanin_answer, spec, QUESTION, packed)
    with pytest.raises(WireFormatError):
        t.run("r", fanin_answer, spec, QUESTION, b"\x00" * 40)
    packed = t.get(t.submit("a", cacheback_send, spec, DOCS[0], QUESTION, n_out=2)[0])
    tampered = bytearray(packed)
    tampered[-1] ^= 1
    with pytest.raises((WireFormatError, SignatureError)):
        t.run("r", fanin_answer, spec, QUESTION, bytes(tampered))
    assert t.run("r", fanin_answer, spec, QUESTION, packed)["signed_by"] == [key_id(t.public_keys()["a"])]


def test_token_rows_past_the_vocabulary_or_without_a_model_are_refused_typed():
    """An id past the receiver's embedding table is a WireFormatError naming the field (on CPU it would be a raw
    IndexError, on CUDA a device assert); a node without a model cannot rebuild token rows: TransportError."""
    import torch

    from latentwire.transport import TransportError
    from latentwire.wire import TokenRows, encode

    node = Node("r", AgentSpec.tiny(ARCH), NodeConfig(wire=True))
    vocab = node.agent.model.get_input_embeddings().num_embeddings
    d = node.agent.geometry.hidden_size

    def message(ids):
        return encode(TokenRows(torch.tensor(ids), torch.zeros(ids.count(-1), d)), protocol="cacheback",
                      sender_geometry=node.agent.geometry)

    assert len(node.unpack(message([3, vocab - 1, -1])).body) == 3  # the last id in the table: fine
    with pytest.raises(WireFormatError, match=rf"tensors.token_ids: id {vocab} is past node 'r'"):
        node.unpack(message([3, vocab]))
    bare = Node("bare", None, NodeConfig(wire=True))
    with pytest.raises(TransportError, match="holds no model"):
        bare.unpack(message([3]))


def test_configuration_errors(zero_copy):
    with pytest.raises(ConfigError, match="no distributed runner"):
        run_protocol(zero_copy, get_protocol("text"), [SENDERS[0]], [DOCS[0]], RECEIVER, QUESTION)
    with pytest.raises(ConfigError, match="on_lost"):
        run_protocol(zero_copy, _protocol("fullkv"), [SENDERS[0]], [DOCS[0]], RECEIVER, QUESTION, on_lost="x")
    with pytest.raises(ConfigError, match="2 senders for 1 documents"):
        run_protocol(zero_copy, _protocol("fullkv"), list(SENDERS), [DOCS[0]], RECEIVER, QUESTION)
    for key in ("cacheback", "chain"):  # not NodeLostError (nothing was lost) nor a chain unpacking None
        with pytest.raises(ConfigError, match="no senders"):
            run_protocol(zero_copy, _protocol(key), [], [], RECEIVER, QUESTION)
    with pytest.raises(UnknownNameError):
        get_transport("carrier-pigeon")
    with pytest.raises(NodeLostError):
        t = InProcessTransport()
        t.add("z", AgentSpec.tiny(ARCH))
        t.kill("z")
        t.run("z", sleep_step, 0)


def test_inprocess_replicas_converge():
    with InProcessTransport() as t:
        for name in "pqrst":
            t.add(name, AgentSpec.tiny(ARCH))
        spec = ("merge", PROTOCOLS["merge"][1])
        for name, doc in zip("pqr", DOCS):  # three fragments on three of five replicas
            t.run(name, merge_think, spec, doc, QUESTION)
        union = set().union(*(digests(t, n) for n in t.nodes))
        report = anti_entropy(t)
        assert report.converged and set(report.digests) == union and len(union) == 3
        assert all(set(digests(t, n)) == union for n in t.nodes)
        assert report.rounds <= 3  # ceil(log2 5)
        again = anti_entropy(t)
        assert again.shipped == 0 and again.exchanges == 0


# -- Ray -----------------------------------------------------------------------------------------------
def test_ray_nodes_are_separate_processes(ray_t):
    pids = {ray_t.pid(n) for n in ray_t.nodes}
    assert len(pids) == len(ray_t.nodes) == 5 and os.getpid() not in pids
    assert len(set(ray_t.public_keys().values())) == 5


@pytest.mark.parametrize("key", ["cacheback", "cacheback_token_ids", "fullkv", "merge", "chain", "cacheback_x"])
def test_ray_matches_inprocess(ray_t, zero_copy, reference, key):
    protocol = _protocol(key)
    remote = run_protocol(ray_t, protocol, list(SENDERS), list(DOCS[:2]), RECEIVER, QUESTION)
    local = run_protocol(zero_copy, protocol, list(SENDERS), list(DOCS[:2]), RECEIVER, QUESTION)
    _same(remote, reference(key))
    _same(remote, local)
    assert remote.details["positions"] == local.details["positions"]
    assert remote.details["answer_token_ids"] == local.details["answer_token_ids"]
    keys = {key_id(k) for k in ray_t.public_keys().values()}
    assert None not in remote.details["signed_by"] and set(remote.details["signed_by"]) <= keys
    assert all(w > 0 for w in remote.details["wire_bytes"])
    assert remote.details["transport"] == "ray"


def test_ray_typed_errors_cross_the_process_boundary(ray_t):
    spec = ("cacheback", PROTOCOLS["cacheback"][1])
    with pytest.raises(WireFormatError):
        ray_t.run(RECEIVER, fanin_answer, spec, QUESTION, ray_t.send(b"\x00" * 40))
    outsider = Node("x", AgentSpec.tiny(ARCH), NodeConfig(wire=True, sign=True))
    from latentwire.transport.run import cacheback_send

    packed, _ = cacheback_send(outsider, spec, DOCS[0], QUESTION)
    with pytest.raises(SignatureError):
        ray_t.run(RECEIVER, fanin_answer, spec, QUESTION, ray_t.send(packed))


def test_ray_kill_mid_run(ray_t, zero_copy, reference):
    """A sender killed while its step waits: the fan-in completes from the survivors (on_lost="skip") with
    the same result as a run without it, or fails with NodeLostError naming it (on_lost="raise")."""
    ray_t.submit("v", sleep_step, 30)  # v is busy: its protocol step queues behind this and never runs
    protocol = _protocol("cacheback")
    a, b = SENDERS
    out = run_protocol(ray_t, protocol, [a, "v", b], list(DOCS), RECEIVER, QUESTION, on_lost="skip",
                       after_dispatch=lambda: ray_t.kill("v"))
    assert out.details["lost"] == ["v"]
    survivors = run_protocol(zero_copy, protocol, [a, b], [DOCS[0], DOCS[2]], RECEIVER, QUESTION)
    assert out.answer == survivors.answer and out.details["positions"] == survivors.details["positions"]
    with pytest.raises(NodeLostError) as err:
        run_protocol(ray_t, protocol, [a, "v"], list(DOCS[:2]), RECEIVER, QUESTION)
    assert err.value.node == "v"


def test_ray_replicas_converge_and_survive_a_kill(ray_t):
    """Fragments on two senders and a victim w; w is killed after the first anti-entropy round. The
    survivors converge, and every fragment a survivor held (before or after) is still there."""
    spec = ("merge", PROTOCOLS["merge"][1])
    for name, doc in zip(SENDERS + ("w",), DOCS):
        ray_t.run(name, merge_think, spec, doc, "Replicate: " + QUESTION)  # a fresh fragment on each
    survivors = SENDERS + (RECEIVER,)
    before = {n: set(ray_t.run(n, replica_digests)) for n in survivors + ("w",)}
    report = anti_entropy(ray_t, survivors + ("w",), after_round=lambda k: ray_t.kill("w") if k == 0 else None)
    assert report.lost == ("w",) and report.converged
    after = {n: set(ray_t.run(n, replica_digests)) for n in survivors}
    assert all(after[n] == set(report.digests) for n in survivors)
    assert all(before[n] <= after[n] for n in after)  # nothing lost from a surviving replica
    assert set().union(*(before[n] for n in survivors)) <= set(report.digests)
    assert report.shipped > 0 and report.shipped_bytes > 0  # deltas crossed as wire bytes
    # the replicas are real FragmentSets: the survivors' fragments decode and re-hash on a fresh transport
    from latentwire.transport.replication import replica_bytes

    assert FragmentSet.from_bytes(ray_t.run(RECEIVER, replica_bytes)).digests == report.digests
    with pytest.raises(NodeLostError):
        ray_t.run("w", replica_digests)



def test_ray_demo_attaches_to_served_agents(ray_t):
    """`latentwire serve` keeps named agent actors up; `latentwire demo --transport ray --attach` uses them."""
    from latentwire.transport.demo import RECEIVER as SERVED_RECEIVER
    from latentwire.transport.demo import demo, sender_names
    from latentwire.transport.base import TransportError

    served = sender_names(2) + [SERVED_RECEIVER]
    assert set(served) <= set(ray_t.nodes)  # the module's nodes carry the served names: attach to them
    lines = []
    rows = demo(AgentSpec.tiny(ARCH), senders=2, latent_steps=1, attach=True, echo=lines.append)
    assert [r[0] for r in rows] == ["cacheback"] * 2 + ["fullkv"] * 2
    assert all(len(out.details["signed_by"]) == 2 and None not in out.details["signed_by"] for *_, out in rows)
    pids = {ray_t.pid(n) for n in served}  # still up: an attached demo does not stop served agents
    assert len(pids) == 3 and all(any(str(p) in line for line in lines) for p in pids)
    with pytest.raises(TransportError, match="attach"):
        from latentwire.transport.ray_transport import RayTransport

        RayTransport().add("receiver", AgentSpec.tiny(ARCH))  # the name is taken by a served node


def test_ray_agent_that_fails_to_load_is_a_typed_error(ray_t):
    """The actor's typed error crosses the process boundary as itself (errors are picklable)."""
    ray_t.add("broken", AgentSpec.pretrained("no-such-model"))
    with pytest.raises(ModelNotFoundError, match="'no-such-model'.*bundled name.*smollm2-135m"):
        ray_t.ready()
    assert "broken" not in ray_t.nodes


def test_chain_with_a_dead_hop_names_it():
    with InProcessTransport() as t:
        for name in ("h0", "h1", "r"):
            t.add(name, AgentSpec.tiny(ARCH))
        t.kill("h1")
        with pytest.raises(NodeLostError) as err:
            run_protocol(t, _protocol("chain"), ["h0", "h1"], list(DOCS[:2]), "r", QUESTION)
        assert err.value.node == "h1"


def test_ray_missing_is_the_missing_extra_error(monkeypatch):
    """Without Ray the transport says which extra to install, with the type the runners stop early on."""
    import sys

    from latentwire.errors import MissingExtraError
    from latentwire.transport import ray_transport

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(MissingExtraError, match=r"latentwire\[ray\]"):
        ray_transport._ray()


def test_a_replica_delta_that_is_not_fragments_is_refused_typed():
    """A misbehaving peer sending a text message as a replica delta: WireFormatError naming the body, not a bare
    TypeError from inside the merge; the replica is unchanged."""
    from latentwire.transport.replication import replica_absorb

    peer, node = (Node(n, AgentSpec.tiny(ARCH), NodeConfig(wire=True)) for n in ("p", "q"))
    before = node.replica
    with pytest.raises(WireFormatError, match="body: a replica delta is a fragment set, node 'q' received str"):
        replica_absorb(node, peer.pack("not fragments", protocol="replica"))
    assert node.replica is before
