"""Replicas exchanging fragments over a lossy network converge (a riak_dt / Yjs-style stateful test).

3-5 replicas each hold a FragmentSet. Rules: a replica creates a fragment (from a small pool, so two
replicas may create the same one); a replica sends its whole set or a subset (partial delivery) to
another as bytes; the network (a list of in-flight messages) delivers any message (reordering),
duplicates one, or drops one; two replicas run a digest-first anti-entropy round. Invariant: every
replica holds only fragments that were created; a delivery adds exactly the digests the receiver lacked.
Teardown: drain the network, then a full anti-entropy sync; all replicas must hold equal sets and
render byte-identical CanonicalMerge states.

Reproducing a failure: Hypothesis prints the shrunk rule sequence (state.create(...), state.send(...),
...) and, with print_blob=True, a line `@reproduce_failure('<version>', b'<blob>')`. Paste that line as a
decorator on `class ReplicaMachine` (so does `@seed(N)` with the seed of a
`pytest --hypothesis-seed=N` run) and rerun this file. Keep any counterexample found as a named regular test at the
bottom (none found so far; the two there are hand-written scenarios).
"""
from __future__ import annotations

import functools

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from latentwire.merge import CanonicalMerge, Fragment, FragmentSet
from latentwire.models import tiny_model, tiny_tokenizer, tokenizer_fingerprint
from latentwire.state import Geometry, KVState, LayerKV

POOL_SIZE = 8
MAX_REPLICAS = 5


@functools.cache
def pool() -> tuple[Fragment, ...]:
    """Small synthetic fragments (1..3 rows, the last latent) on the tiny llama geometry."""
    geometry = Geometry.from_model(tiny_model("llama"), "llama", tokenizer_fingerprint(tiny_tokenizer()))
    out = []
    for seed in range(POOL_SIZE):
        g = torch.Generator().manual_seed(100 + seed)
        T, H, D = 1 + seed % 3, geometry.num_kv_heads, geometry.head_dim
        pos = torch.arange(T)
        layers = tuple(LayerKV(torch.randn(H, T, D, generator=g), torch.randn(H, T, D, generator=g), pos)
                       for _ in range(geometry.num_layers))
        ids = torch.randint(5, 261, (T,), generator=g)
        ids[-1] = -1
        out.append(Fragment.of(KVState(geometry, layers, pos, ids, torch.randn(1, geometry.hidden_size, generator=g))))
    return tuple(out)


def sync(a: FragmentSet, b: FragmentSet) -> tuple[FragmentSet, FragmentSet, int]:
    """One digest-first anti-entropy round between two replicas: (new a, new b, fragment bytes shipped)."""
    to_b = a.missing_from(b.digests)  # a learns b's digests, ships only what b lacks
    to_a = b.missing_from(a.digests)
    wire_b, wire_a = to_b.to_bytes(), to_a.to_bytes()
    return a.merge(FragmentSet.from_bytes(wire_a)), b.merge(FragmentSet.from_bytes(wire_b)), len(wire_a) + len(wire_b)


def full_sync(replicas: list[FragmentSet]) -> list[FragmentSet]:
    """Two passes of pairwise anti-entropy around the ring: the first gathers everything at replica 0,
    the second spreads it."""
    replicas = list(replicas)
    n = len(replicas)
    for _ in range(2):
        for i in range(n):
            j = (i + 1) % n
            replicas[i], replicas[j], _ = sync(replicas[i], replicas[j])
    return replicas


class ReplicaMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.replicas: list[FragmentSet] = []
        self.created: set[str] = set()
        self.network: list[tuple[int, bytes]] = []  # in flight: (destination, FragmentSet bytes)

    @initialize(n=st.integers(3, MAX_REPLICAS))
    def start(self, n):
        self.replicas = [FragmentSet() for _ in range(n)]

    def _replica(self, r: int) -> int:
        return r % len(self.replicas)

    @rule(r=st.integers(0, MAX_REPLICAS - 1), i=st.integers(0, POOL_SIZE - 1))
    def create(self, r, i):
        r, f = self._replica(r), pool()[i]
        before = self.replicas[r]
        self.replicas[r] = before.add(f)
        self.created.add(f.digest)
        assert (self.replicas[r] is before) == (f.digest in before)  # a present digest is absorbed

    @rule(src=st.integers(0, MAX_REPLICAS - 1), dst=st.integers(0, MAX_REPLICAS - 1), partial=st.booleans(),
          data=st.data())
    def send(self, src, dst, partial, data):
        src, dst = self._replica(src), self._replica(dst)
        payload = self.replicas[src]
        if partial and len(payload):
            payload = payload.subset(data.draw(st.sets(st.sampled_from(payload.digests)), label="subset"))
        self.network.append((dst, payload.to_bytes()))

    @precondition(lambda self: self.network)
    @rule(k=st.integers(0, 1000))
    def deliver(self, k):  # any in-flight message, not just the oldest: reordering
        dst, data = self.network.pop(k % len(self.network))
        received = FragmentSet.from_bytes(data)
        merged = self.replicas[dst].merge(received)
        assert len(merged) == len(set(self.replicas[dst].digests) | set(received.digests))
        self.replicas[dst] = merged

    @precondition(lambda self: self.network)
    @rule(k=st.integers(0, 1000))
    def duplicate(self, k):
        self.network.append(self.network[k % len(self.network)])

    @precondition(lambda self: self.network)
    @rule(k=st.integers(0, 1000))
    def drop(self, k):
        self.network.pop(k % len(self.network))

    @rule(a=st.integers(0, MAX_REPLICAS - 1), b=st.integers(0, MAX_REPLICAS - 1))
    def anti_entropy(self, a, b):
        a, b = self._replica(a), self._replica(b)
        if a == b:
            return
        union = self.replicas[a].merge(self.replicas[b])
        self.replicas[a], self.replicas[b], _ = sync(self.replicas[a], self.replicas[b])
        assert self.replicas[a] == self.replicas[b] == union

    @invariant()
    def only_created_fragments(self):
        for r in self.replicas:
            assert set(r.digests) <= self.created
            assert list(r.digests) == sorted(r.digests)

    def teardown(self):
        if not self.replicas:
            return
        while self.network:  # drain what is still in flight (it can only add created fragments)
            dst, data = self.network.pop()
            self.replicas[dst] = self.replicas[dst].merge(FragmentSet.from_bytes(data))
        replicas = full_sync(self.replicas)
        want = FragmentSet(f for f in pool() if f.digest in self.created)
        assert all(r == want for r in replicas), [len(r) for r in replicas]
        if len(want):
            digests = {CanonicalMerge().render(r).digest() for r in replicas}
            # each replica's set was assembled in its own arrival order; render from reversed input too
            digests.add(CanonicalMerge().render(list(reversed(list(replicas[0])))).digest())
            assert len(digests) == 1


ReplicaMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None,
                                            print_blob=True)
TestReplicas = ReplicaMachine.TestCase


# -- named scenarios (and future counterexamples) -------------------------------------------------
def test_duplicated_and_reordered_delivery_is_absorbed():
    """A set delivered twice, interleaved with a partial delivery, equals one delivery."""
    a, b, c, d = pool()[:4]
    sender = FragmentSet([a, b, c])
    partial = sender.subset([b.digest, c.digest]).to_bytes()
    full = sender.to_bytes()
    r = FragmentSet([d])
    for data in (partial, full, partial, full):
        r = r.merge(FragmentSet.from_bytes(data))
    assert r == FragmentSet([a, b, c, d]) and len(r) == 4


def test_full_sync_after_drops_converges():
    """Every message dropped: only anti-entropy carries fragments, and it ships each missing one once."""
    frags = pool()
    replicas = [FragmentSet(frags[i::3]) for i in range(3)]
    synced = full_sync(replicas)
    assert all(r == FragmentSet(frags) for r in synced)
    _, _, shipped = sync(synced[0], synced[1])
    assert shipped == 2 * len(FragmentSet().to_bytes())  # nothing left to ship: two empty deltas
