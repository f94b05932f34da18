"""Content-addressed fragments and FragmentSet, the state-based CvRDT of merged latent traces
(docs/methods.md#fragments).

A fragment is one agent's finished state; its id is the SHA-256 of the state's canonical bytes, so
two agents that produce the same bytes produce the same fragment. A FragmentSet maps digest ->
fragment and merges by set union, which is commutative, associative and idempotent; adding a
fragment already present changes nothing (a re-delivered duplicate is absorbed, never concatenated
twice). Turning a set into one cache is a separate, pure render (`merge.base.Render`).

Anti-entropy between replicas: exchange `digests` first, then ship only `missing_from(their digests)`
(its `to_bytes()` is the delta on the wire).

Wire format of a set (`to_bytes`): 8 bytes little-endian header length n, n bytes of canonical JSON
{"format", "version", "digests": sorted, "sizes": byte length of each fragment}, then each
fragment's canonical KVState bytes in digest order. Same set -> same bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from ..errors import GeometryMismatchError, StateFormatError
from ..state import Geometry, KVState, canonical_json, check_format

FORMAT = "latentwire.fragmentset"
VERSION = 1
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, eq=False)
class Fragment:
    """One finished state and its content address. Equal (and hashed) by digest.

    The state's tensors are not copied: mutating them in place afterwards breaks the digest.
    """

    state: KVState
    digest: str = field(init=False)  # state.digest(): SHA-256 hex of the canonical bytes

    def __post_init__(self):
        if not isinstance(self.state, KVState):
            raise TypeError(f"a fragment wraps a KVState, not {type(self.state).__name__}")
        if len(self.state) == 0:
            raise StateFormatError("a fragment needs at least one row (got an empty state)")
        if (bad := self.state.nonfinite()) is not None:  # NaN keys would make CanonicalMerge's order arrival-dependent
            raise StateFormatError(f"a fragment's tensors must be finite: {bad} holds a NaN or an infinity")
        object.__setattr__(self, "digest", self.state.digest())

    @classmethod
    def of(cls, state: KVState) -> "Fragment":
        return cls(state)

    @property
    def geometry(self) -> Geometry:
        return self.state.geometry

    def __len__(self) -> int:
        return len(self.state)

    def __eq__(self, other) -> bool:
        return self.digest == other.digest if isinstance(other, Fragment) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Fragment({self.digest[:12]}, rows={len(self)}, model={self.geometry.model!r})"

    def to(self, device: torch.device | str) -> "Fragment":
        """The same fragment with its state on `device`: the digest is kept (canonical bytes do not
        depend on where the tensors live), so nothing is re-serialised."""
        if self.state.device == torch.device(device):
            return self
        out = object.__new__(Fragment)
        object.__setattr__(out, "state", self.state.to(device))
        object.__setattr__(out, "digest", self.digest)
        return out


class FragmentSet:
    """Immutable set of fragments keyed by digest, all of one geometry (unknown while empty).

    `add` and `merge` return a new set (or `self` when nothing is new); fragments of another
    geometry raise GeometryMismatchError. Iteration yields fragments in digest order.
    """

    __slots__ = ("_items", "_geometry")

    def __init__(self, fragments: Iterable[Fragment] = ()):
        items: dict[str, Fragment] = {}
        geometry = None
        for f in fragments:
            if not isinstance(f, Fragment):
                raise TypeError(f"a FragmentSet holds Fragments, not {type(f).__name__} (wrap states with Fragment.of)")
            if geometry is None:
                geometry = f.geometry
            _check_same(geometry, f.geometry)
            items.setdefault(f.digest, f)
        self._items = dict(sorted(items.items()))
        self._geometry = geometry

    @classmethod
    def _trusted(cls, items: dict[str, Fragment], geometry: Geometry | None) -> "FragmentSet":
        """A set from already-checked fragments of one geometry (no re-validation)."""
        new = cls.__new__(cls)
        new._items, new._geometry = dict(sorted(items.items())), geometry if items else None
        return new

    @classmethod
    def of(cls, *states: KVState) -> "FragmentSet":
        return cls(Fragment.of(s) for s in states)

    # -- read ---------------------------------------------------------------------------------
    @property
    def geometry(self) -> Geometry | None:
        return self._geometry

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(self._items)  # sorted at construction

    @property
    def fragments(self) -> tuple[Fragment, ...]:
        return tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Fragment]:
        return iter(self._items.values())

    def __contains__(self, item) -> bool:
        return (item.digest if isinstance(item, Fragment) else item) in self._items

    def __getitem__(self, digest: str) -> Fragment:
        try:
            return self._items[digest]
        except KeyError:
            raise KeyError(f"no fragment with digest {digest!r} in this set") from None

    def __eq__(self, other) -> bool:
        return self._items.keys() == other._items.keys() if isinstance(other, FragmentSet) else NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._items))

    def __repr__(self) -> str:
        return f"FragmentSet({len(self)} fragments: {', '.join(d[:8] for d in self._items)})"

    # -- CvRDT ----------------------------------------------------------------------------------
    def add(self, fragment: Fragment) -> "FragmentSet":
        """This set plus `fragment`; a digest already present is absorbed (returns `self`)."""
        if not isinstance(fragment, Fragment):
            raise TypeError(f"add takes a Fragment, not {type(fragment).__name__} (wrap states with Fragment.of)")
        self._check_geometry(fragment.geometry)
        if fragment.digest in self._items:
            return self
        return FragmentSet._trusted(self._items | {fragment.digest: fragment}, fragment.geometry)

    def merge(self, other: "FragmentSet") -> "FragmentSet":
        """Set union: commutative, associative, idempotent. Returns an operand when it already is the union."""
        if not isinstance(other, FragmentSet):
            raise TypeError(f"merge takes a FragmentSet, not {type(other).__name__}")
        if other._geometry is not None:
            self._check_geometry(other._geometry)
        if other._items.keys() <= self._items.keys():
            return self
        if self._items.keys() <= other._items.keys():
            return other
        return FragmentSet._trusted(other._items | self._items, self._geometry or other._geometry)

    def _check_geometry(self, geometry: Geometry) -> None:
        if self._geometry is not None:
            _check_same(self._geometry, geometry)

    # -- anti-entropy -----------------------------------------------------------------------------
    def diff(self, digests: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(digests only this set holds, digests only the peer holds), each sorted."""
        theirs = set(digests)
        return tuple(d for d in self._items if d not in theirs), tuple(sorted(theirs - self._items.keys()))

    def missing_from(self, digests: Iterable[str]) -> "FragmentSet":
        """The fragments a peer holding `digests` lacks: what to ship it."""
        theirs = set(digests)
        return FragmentSet._trusted({d: f for d, f in self._items.items() if d not in theirs}, self._geometry)

    def subset(self, digests: Iterable[str]) -> "FragmentSet":
        """The fragments with these digests (each must be present)."""
        return FragmentSet._trusted({d: self[d] for d in set(digests)}, self._geometry)

    # -- bytes ----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        parts = [f.state.to_bytes() for f in self._items.values()]
        header = {"format": FORMAT, "version": VERSION, "digests": list(self._items),
                  "sizes": [len(p) for p in parts]}
        head = canonical_json(header).encode()
        return len(head).to_bytes(8, "little") + head + b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> "FragmentSet":
        """Strict decoder: every fragment's bytes must hash to its listed digest and be canonical."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StateFormatError(f"want bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < 8:
            raise StateFormatError(f"truncated: {len(data)} bytes, the header length alone takes 8")
        n = int.from_bytes(data[:8], "little")
        if n > len(data) - 8:
            raise StateFormatError(f"header length {n} exceeds the {len(data) - 8} bytes that follow")
        try:
            header = json.loads(data[8:8 + n])
        except (ValueError, RecursionError) as e:  # bad JSON/UTF-8, over-deep nesting, 4,300+ digit ints
            raise StateFormatError(f"header: not JSON ({type(e).__name__}: {str(e)[:200]})") from e
        if not isinstance(header, dict):
            raise StateFormatError(f"header: want a JSON object, got {type(header).__name__}")
        check_format(header, FORMAT, VERSION)
        digests, sizes = header.get("digests"), header.get("sizes")
        if not isinstance(digests, list) or not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in digests):
            raise StateFormatError("header.digests: want a list of 64-character lowercase hex SHA-256 digests")
        if any(a >= b for a, b in zip(digests, digests[1:])):
            raise StateFormatError("header.digests: must be strictly increasing (sorted, no duplicates)")
        if (not isinstance(sizes, list) or len(sizes) != len(digests)
                or not all(type(s) is int and s > 0 for s in sizes)):
            raise StateFormatError(f"header.sizes: want {len(digests)} positive integers, one per digest")
        if 8 + n + sum(sizes) != len(data):
            raise StateFormatError(f"body: header lists {sum(sizes)} bytes of fragments, payload has "
                                   f"{len(data) - 8 - n}")
        fragments, offset = [], 8 + n
        for i, (digest, size) in enumerate(zip(digests, sizes)):
            part, offset = data[offset:offset + size], offset + size
            if hashlib.sha256(part).hexdigest() != digest:
                raise StateFormatError(f"fragments[{i}]: bytes do not hash to the listed digest {digest[:12]}…")
            try:
                fragment = Fragment(KVState.from_bytes(part))
            except StateFormatError as e:
                raise StateFormatError(f"fragments[{i}] ({digest[:12]}…): {e}") from e
            if fragment.digest != digest:
                raise StateFormatError(f"fragments[{i}]: bytes are not canonical (they decode to a state with "
                                       f"digest {fragment.digest[:12]}…, listed {digest[:12]}…)")
            if fragments:
                try:
                    fragments[0].geometry.check_same(fragment.geometry)
                except GeometryMismatchError as e:
                    raise StateFormatError(f"fragments[{i}]: geometry differs from fragments[0]: {e}") from e
            fragments.append(fragment)
        return cls(fragments)


def _check_same(a: Geometry, b: Geometry) -> None:
    if a is not b:
        try:
            a.check_same(b)
        except GeometryMismatchError as e:
            raise GeometryMismatchError(f"fragments of different geometry never merge: {e}") from None
