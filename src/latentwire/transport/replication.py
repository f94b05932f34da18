"""FragmentSet replicas on different nodes, converging by anti-entropy.

Every node holds a replica (`Node.replica`, a FragmentSet: a state-based CRDT whose merge is set
union). One exchange between nodes a and b:

1. each side's **summary** (fragment count + SHA-256 of its sorted digests); equal summaries: done;
2. each side's **digests**;
3. a ships `missing_from(b's digests)` to b, and b ships `missing_from(a's digests)` to a: only the
   fragments the peer lacks, as one wire message of encoding "fragments" (re-hashed on arrival;
   signed and sealed like every message of the transport), straight from node to node;
4. each side merges what it received. A merge only ever adds, so no replica loses a fragment.

`anti_entropy` pairs node i with node (i + 2^k) mod n in round k (push-pull), so n replicas agree
after ceil(log2 n) rounds, then checks the summaries and keeps going (up to `max_rounds`) if they
differ. A node that dies mid-sync is dropped (listed in `SyncReport.lost`) and the survivors carry
on among themselves.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .base import NodeLostError, Transport


# -- steps --------------------------------------------------------------------------------------------
def replica_summary(node) -> tuple[int, str]:
    h = hashlib.sha256("\n".join(node.replica.digests).encode()).hexdigest()
    return len(node.replica), h


def replica_digests(node) -> tuple[str, ...]:
    return node.replica.digests


def replica_delta(node, their_digests: Sequence[str]):
    """(message holding the fragments the peer lacks, or None; (how many, bytes on the wire))."""
    delta = node.replica.missing_from(their_digests)
    if not len(delta):
        return None, (0, 0)
    packed = node.pack(delta, protocol="replica")
    return packed, (len(delta), len(packed) if isinstance(packed, (bytes, bytearray, memoryview)) else 0)


def replica_absorb(node, packed) -> int:
    """Merge a delta into this replica; returns how many fragments were new here."""
    if packed is None:
        return 0
    from ..merge import FragmentSet
    from ..wire import WireFormatError

    got = node.unpack(packed, expect=False).body
    if not isinstance(got, FragmentSet):  # a misbehaving peer: say so, do not fail inside the merge
        raise WireFormatError("body", f"a replica delta is a fragment set, node {node.name!r} received "
                                      f"{type(got).__name__}")
    before = len(node.replica)
    node.replica = node.replica.merge(got)
    return len(node.replica) - before


def replica_bytes(node) -> bytes:
    """The whole replica as canonical FragmentSet bytes (inspection; the wire carries only deltas)."""
    return node.replica.to_bytes()


# -- driver -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyncReport:
    rounds: int
    exchanges: int  # pairs that differed and swapped deltas
    shipped: int  # fragments shipped, summed over both directions of every exchange
    shipped_bytes: int  # bytes of the deltas that crossed (0 by reference)
    lost: tuple[str, ...]  # nodes that died during the sync
    converged: bool  # every surviving replica holds the same digests
    digests: tuple[str, ...]  # the union the survivors converged to (sorted)


def summaries(transport: Transport, nodes: Sequence[str]) -> dict[str, tuple[int, str]]:
    handles = {n: transport.submit(n, replica_summary) for n in nodes}
    return {n: transport.get(h) for n, h in handles.items()}


def digests(transport: Transport, node: str) -> tuple[str, ...]:
    return transport.run(node, replica_digests)


def anti_entropy(transport: Transport, nodes: Sequence[str] | None = None, *, max_rounds: int | None = None,
                 after_round: Callable[[int], None] | None = None) -> SyncReport:
    """Bring the replicas of `nodes` (default: every node) to the same FragmentSet.

    after_round(k): called after round k (tests use it to kill a node mid-sync).
    """
    live = list(transport.nodes if nodes is None else nodes)
    lost: list[str] = []
    base_rounds = max(1, math.ceil(math.log2(max(len(live), 2))))
    max_rounds = base_rounds + 2 if max_rounds is None else max_rounds
    rounds = exchanges = shipped = shipped_bytes = 0

    def drop(node: str) -> None:
        if node in live:
            live.remove(node)
            lost.append(node)

    for k in range(max_rounds):
        if len(live) < 2:
            break
        n = len(live)
        step = 1 << (k % base_rounds)
        pairs = sorted({tuple(sorted((live[i], live[(i + step) % n]))) for i in range(n)} - {(x, x) for x in live})
        for a, b in pairs:
            if a not in live or b not in live:
                continue
            try:
                e, s, nb = _exchange(transport, a, b)
            except NodeLostError as err:
                drop(err.node if err.node in (a, b) else a)
                continue
            exchanges, shipped, shipped_bytes = exchanges + e, shipped + s, shipped_bytes + nb
        rounds = k + 1
        if after_round is not None:
            after_round(k)
            for x in [x for x in live if x not in transport.nodes]:
                drop(x)
        if k + 1 >= base_rounds and _agree(transport, live, drop):
            break
    converged = _agree(transport, live, drop)
    union = digests(transport, live[0]) if live and converged else ()
    return SyncReport(rounds, exchanges, shipped, shipped_bytes, tuple(lost), converged, tuple(union))


def _agree(transport: Transport, live: list[str], drop) -> bool:
    seen = set()
    for n in list(live):
        try:
            seen.add(transport.run(n, replica_summary))
        except NodeLostError:
            drop(n)
    return len(seen) <= 1


def _exchange(t: Transport, a: str, b: str) -> tuple[int, int, int]:
    """One push-pull exchange. Returns (1 if anything moved else 0, fragments shipped, bytes shipped)."""
    sa, sb = t.submit(a, replica_summary), t.submit(b, replica_summary)
    if _get(t, sa, a) == _get(t, sb, b):
        return 0, 0, 0
    da, db = t.submit(a, replica_digests), t.submit(b, replica_digests)
    da, db = _get(t, da, a), _get(t, db, b)
    to_b, n_ab = t.submit(a, replica_delta, db, n_out=2)
    to_a, n_ba = t.submit(b, replica_delta, da, n_out=2)
    # Wait for both deltas (small counts only) first, so a lost node is named correctly; the deltas then
    # go node to node.
    (n1, b1), (n2, b2) = _get(t, n_ab, a), _get(t, n_ba, b)
    got_b, got_a = t.submit(b, replica_absorb, to_b), t.submit(a, replica_absorb, to_a)
    _get(t, got_b, b), _get(t, got_a, a)
    return 1, n1 + n2, b1 + b2


def _get(t: Transport, handle, node: str):
    try:
        return t.get(handle)
    except NodeLostError as e:
        raise NodeLostError(node, e.reason) from None
