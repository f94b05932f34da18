"""FragmentSet CvRDT laws (Hypothesis), permutation-independence of CanonicalMerge, ties, geometry, bytes.

Fragments are small synthetic states built directly on the tiny llama geometry (no forward pass), so
each Hypothesis example costs microseconds. Each law runs LAW_EXAMPLES cases (4 x 250 = 1,000).
A failing example prints a `@reproduce_failure(...)` blob (print_blob=True); `pytest --hypothesis-seed=N`
replays a whole run.
"""
import hashlib
import itertools
import json
import math

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latentwire.errors import ConfigError, GeometryMismatchError, StateFormatError, UnknownNameError
from latentwire.merge import RENDERS, BagMerge, CanonicalMerge, Fragment, FragmentSet, Render, get_render
from latentwire.state import KVState, LayerKV

POOL_SIZE = 10
LAW_EXAMPLES = 250
LAW = settings(max_examples=LAW_EXAMPLES, deadline=None, print_blob=True)


def synthetic(geometry, seed: int, rows: int | None = None) -> KVState:
    """A compact state of 1..4 rows (the last one latent) with random keys/values on every layer."""
    g = torch.Generator().manual_seed(seed)
    T = rows or 1 + seed % 4
    H, D = geometry.num_kv_heads, geometry.head_dim
    pos = torch.arange(T)
    layers = tuple(LayerKV(torch.randn(H, T, D, generator=g) * (1 + seed % 3), torch.randn(H, T, D, generator=g), pos)
                   for _ in range(geometry.num_layers))
    token_ids = torch.randint(5, 261, (T,), generator=g)
    token_ids[-1] = -1
    return KVState(geometry, layers, pos, token_ids, torch.randn(1, geometry.hidden_size, generator=g))


@pytest.fixture(scope="module")
def llama_geometry(geometry_for):
    return geometry_for("llama")


@pytest.fixture(scope="module")
def pool(llama_geometry):
    return [Fragment.of(synthetic(llama_geometry, seed)) for seed in range(POOL_SIZE)]


@pytest.fixture(scope="module")
def copies(pool):
    """The pool's fragments re-decoded from bytes: equal digests, distinct objects (a re-delivery)."""
    return [Fragment.of(KVState.from_bytes(f.state.to_bytes())) for f in pool]


def as_set(pool, idx) -> FragmentSet:
    return FragmentSet(pool[i] for i in idx)


indices = st.lists(st.integers(0, POOL_SIZE - 1), max_size=POOL_SIZE)


# -- the four laws --------------------------------------------------------------------------------
@LAW
@given(a=indices, b=indices)
def test_merge_is_commutative(pool, a, b):
    A, B = as_set(pool, a), as_set(pool, b)
    ab, ba = A.merge(B), B.merge(A)
    assert ab == ba and hash(ab) == hash(ba) and ab.digests == ba.digests
    assert set(ab.digests) == {pool[i].digest for i in a + b}
    assert ab.to_bytes() == ba.to_bytes()


@LAW
@given(a=indices, b=indices, c=indices)
def test_merge_is_associative(pool, a, b, c):
    A, B, C = as_set(pool, a), as_set(pool, b), as_set(pool, c)
    left, right = A.merge(B).merge(C), A.merge(B.merge(C))
    assert left == right and left.digests == right.digests


@LAW
@given(a=indices, b=indices)
def test_merge_is_idempotent(pool, copies, a, b):
    A, B = as_set(pool, a), as_set(pool, b)
    assert A.merge(A) is A
    assert A.merge(as_set(copies, a)) == A  # the same set, received again over the wire
    AB = A.merge(B)
    assert AB.merge(B) == AB and AB.merge(A) == AB


@LAW
@given(a=indices, i=st.integers(0, POOL_SIZE - 1))
def test_add_absorbs_present_fragment(pool, copies, a, i):
    A = as_set(pool, a + [i])
    assert A.add(pool[i]) is A and A.add(copies[i]) is A  # a duplicate, even a re-decoded one, is absorbed
    assert len(A.add(copies[i])) == len(set(a + [i]))
    B = as_set(pool, a)
    assert B.add(pool[i]) == B.merge(FragmentSet([copies[i]])) == A
    assert B.add(pool[i]).add(copies[i]) == A


@settings(max_examples=50, deadline=None, print_blob=True)
@given(a=indices)
def test_bytes_round_trip(pool, a):
    A = as_set(pool, a)
    data = A.to_bytes()
    back = FragmentSet.from_bytes(data)
    assert back == A and back.to_bytes() == data and back.digests == A.digests


# -- FragmentSet basics -----------------------------------------------------------------------------
def test_fragment_is_content_addressed(pool, copies):
    f = pool[3]
    assert f.digest == f.state.digest() == hashlib.sha256(f.state.to_bytes()).hexdigest()
    assert copies[3] == f and copies[3] is not f and hash(copies[3]) == hash(f)
    assert pool[3] != pool[4] and len(f) == len(f.state)
    with pytest.raises(StateFormatError, match="at least one row"):
        Fragment.of(f.state.select([]))
    with pytest.raises(TypeError):
        Fragment.of("not a state")


def test_empty_set(pool):
    empty = FragmentSet()
    assert len(empty) == 0 and empty.geometry is None and empty.digests == () and list(empty) == []
    assert empty.merge(empty) == empty and empty.merge(FragmentSet(pool[:2])) == FragmentSet(pool[:2])
    assert FragmentSet.from_bytes(empty.to_bytes()) == empty
    with pytest.raises(ValueError, match="nothing to render"):
        CanonicalMerge().render(empty)


def test_iteration_is_in_digest_order(pool):
    s = FragmentSet(reversed(pool))
    assert [f.digest for f in s] == sorted(f.digest for f in pool) == list(s.digests)
    assert pool[0] in s and pool[0].digest in s and s[pool[0].digest] is pool[0]
    with pytest.raises(KeyError, match="no fragment"):
        s["0" * 64]


def test_anti_entropy_ships_only_the_difference(pool):
    mine, theirs = FragmentSet(pool[:6]), FragmentSet(pool[4:])
    only_mine, only_theirs = mine.diff(theirs.digests)
    assert set(only_mine) == {f.digest for f in pool[:4]} and set(only_theirs) == {f.digest for f in pool[6:]}
    ship = mine.missing_from(theirs.digests)
    assert ship.digests == only_mine and theirs.merge(ship) == mine.merge(theirs)
    assert len(ship.to_bytes()) < len(mine.to_bytes())
    assert mine.subset(only_mine) == ship
    assert mine.missing_from(mine.digests) == FragmentSet() and mine.missing_from(mine.digests).geometry is None


def test_geometry_mismatch_is_typed(pool, geometry_for):
    other = Fragment.of(synthetic(geometry_for("qwen2"), 0))
    s = FragmentSet(pool[:2])
    with pytest.raises(GeometryMismatchError, match="never merge"):
        s.add(other)
    with pytest.raises(GeometryMismatchError, match="never merge"):
        s.merge(FragmentSet([other]))
    with pytest.raises(GeometryMismatchError, match="never merge"):
        FragmentSet([pool[0], other])
    with pytest.raises(GeometryMismatchError):
        CanonicalMerge().render([pool[0], other])
    with pytest.raises(GeometryMismatchError):
        BagMerge().render([other, pool[0]])
    assert FragmentSet().add(other).geometry == other.geometry  # an empty set takes the first geometry


# -- renders --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_canonical_merge_is_byte_identical_under_every_permutation(pool, n):
    frags = pool[:n]
    canonical, bag = set(), set()
    for perm in itertools.permutations(range(n)):
        canonical.add(CanonicalMerge().render([frags[i] for i in perm]).digest())
        bag.add(BagMerge(order=perm).render(frags).digest())
    assert len(canonical) == 1
    assert len(bag) == math.factorial(n) > 1  # BagMerge: every order gives other bytes
    render = CanonicalMerge()
    ordered = render.order(frags)
    assert [render.key(f) for f in ordered] == sorted(render.key(f) for f in frags)
    assert BagMerge().render(ordered).digest() in canonical  # = BagMerge in the canonical order


def test_render_is_exact_concatenation(pool):
    frags = pool[:4]
    state = BagMerge(order=(2, 0, 3, 1)).render(frags)
    assert state.is_compact and len(state) == sum(len(f) for f in frags)
    offset = 0
    for f in (frags[2], frags[0], frags[3], frags[1]):
        rows = list(range(offset, offset + len(f)))
        moved = f.state.shift(offset)  # the block, rotated to where it now sits
        block = state.select(rows)
        assert torch.equal(block.token_ids, f.state.token_ids) and torch.equal(block.latents, f.state.latents)
        for a, b in zip(block.layers, moved.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        offset += len(f)


def test_render_of_a_set_and_of_its_fragments_agree(pool, copies):
    s = FragmentSet(pool[:5])
    assert CanonicalMerge().render(s).digest() == CanonicalMerge().render(reversed(copies[:5])).digest()
    assert CanonicalMerge()(s).digest() == CanonicalMerge().render([f.state for f in pool[:5]]).digest()


def test_render_refuses_duplicates(pool, copies):
    with pytest.raises(ValueError, match="given twice"):
        CanonicalMerge().render([pool[0], pool[1], copies[0]])


def test_canonical_ties_are_broken_by_digest(llama_geometry):
    """Same K-norm multiset at the ranking layer, different content: the digest decides, not input order."""
    base = synthetic(llama_geometry, 7, rows=3)
    layer = llama_geometry.num_layers // 2
    swapped = list(base.layers)  # other heads order at the ranking layer: same norms, other bytes
    swapped[layer] = LayerKV(base.layers[layer].keys.flip(0), base.layers[layer].values, base.layers[layer].positions)
    values = list(base.layers)  # same keys everywhere, other values
    values[0] = LayerKV(values[0].keys, values[0].values + 1, values[0].positions)
    a, b, c = (Fragment.of(base), Fragment.of(base._replace(layers=tuple(swapped))),
               Fragment.of(base._replace(layers=tuple(values))))
    render = CanonicalMerge()
    assert render.key(a) == render.key(b) == render.key(c) and len({a.digest, b.digest, c.digest}) == 3
    want = sorted([a, b, c], key=lambda f: f.digest)
    digests = set()
    for perm in itertools.permutations([a, b, c]):
        assert render.order(list(perm)) == want
        digests.add(render.render(list(perm)).digest())
    assert len(digests) == 1


def test_canonical_layer_is_validated(pool):
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError):
            CanonicalMerge(layer=bad)
    n = pool[0].geometry.num_layers
    last = CanonicalMerge(layer=n - 1).render(pool[:2])
    assert len(last) == sum(len(f.state) for f in pool[:2])
    with pytest.raises(ConfigError, match=f"has {n} layers"):
        CanonicalMerge(layer=n).render(pool[:2])
    # another layer can change the order, never the permutation-independence
    for layer in range(n):
        assert len({CanonicalMerge(layer=layer).render(p).digest() for p in itertools.permutations(pool[:3])}) == 1


@pytest.mark.parametrize("n", [2, 3, 4])
def test_canonical_directions_are_both_order_free_and_differ(pool, n):
    frags = pool[:n]
    up, down = CanonicalMerge(), CanonicalMerge(direction="descending")
    assert up.direction == "ascending"  # the default: today's order
    digests = {d: {r.render([frags[i] for i in perm]).digest() for perm in itertools.permutations(range(n))}
               for d, r in (("ascending", up), ("descending", down))}
    assert len(digests["ascending"]) == len(digests["descending"]) == 1  # each byte-identical under permutation
    assert digests["ascending"] != digests["descending"]
    assert down.order(frags) == up.order(frags)[::-1]
    keys = [down.key(f) for f in down.order(frags)]
    assert keys == sorted(keys, reverse=True)
    with pytest.raises(ConfigError, match="direction"):
        CanonicalMerge(direction="up")
    assert get_render("canonical", direction="descending") == down


def test_bag_merge_validates_order(pool):
    for bad in ((0, 0), (1, 2), (0, 1.0), (-1, 0)):
        with pytest.raises(ValueError, match="order"):
            BagMerge(order=bad)
    with pytest.raises(ValueError, match="for 2 fragments, got 3"):
        BagMerge(order=(1, 0)).render(pool[:3])
    assert BagMerge(order=[1, 0]) == BagMerge(order=(1, 0)) and BagMerge().permutation is None


def test_registry():
    assert set(RENDERS) == {"bag", "canonical"} and all(issubclass(c, Render) for c in RENDERS.values())
    assert get_render("canonical", layer=1) == CanonicalMerge(layer=1)
    assert get_render("bag", order=(0,)) == BagMerge(order=(0,))
    with pytest.raises(UnknownNameError, match="valid: bag, canonical"):
        get_render("packllm")


# -- strict decoder -------------------------------------------------------------------------------
def parts(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def rebuild(header: dict, body: bytes) -> bytes:
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return len(head).to_bytes(8, "little") + head + body


def edit_header(fn):
    def go(data):
        header, body = parts(data)
        fn(header)
        return rebuild(header, body)
    return go


def flip_body_byte(data: bytes) -> bytes:
    i = len(data) - 3  # inside the last fragment's tensor data
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


def wrong_digest(data: bytes) -> bytes:
    header, body = parts(data)
    header["digests"][-1] = "f" * 64  # still sorted and well formed, but not the hash of the bytes
    return rebuild(header, body)


def blobs(header: dict, body: bytes) -> list[bytes]:
    ends = list(itertools.accumulate(header["sizes"]))
    return [body[e - n:e] for e, n in zip(ends, header["sizes"])]


def non_canonical_fragment(data: bytes) -> bytes:
    """Last fragment re-encoded with an indented header: the same state, other bytes (and their hash listed)."""
    header, body = parts(data)
    *rest, last = blobs(header, body)
    n = int.from_bytes(last[:8], "little")
    meta = json.loads(json.loads(last[8:8 + n])["__metadata__"]["latentwire"])
    messy = safetensors.torch.save(safetensors.torch.load(last), metadata={"latentwire": json.dumps(meta, indent=1)})
    items = sorted([*zip(header["digests"], rest), (hashlib.sha256(messy).hexdigest(), messy)])
    header.update(digests=[d for d, _ in items], sizes=[len(b) for _, b in items])
    return rebuild(header, b"".join(b for _, b in items))


CORRUPT = {
    "flipped-body-byte": (flip_body_byte, "do not hash"),
    "wrong-digest": (wrong_digest, "do not hash"),
    "non-canonical-fragment": (non_canonical_fragment, "not canonical"),
    "truncated": (lambda d: d[:-1], "body"),
    "extra-byte": (lambda d: d + b"\0", "body"),
    "too-short": (lambda d: d[:5], "truncated"),
    "header-length-too-big": (lambda d: (len(d)).to_bytes(8, "little") + d[8:], "header length"),
    "header-not-json": (lambda d: (3).to_bytes(8, "little") + b"{no", "not JSON"),
    "header-not-object": (lambda d: (2).to_bytes(8, "little") + b"[]", "JSON object"),
    "wrong-format": (edit_header(lambda h: h.update(format="x")), "header.format"),
    "wrong-version": (edit_header(lambda h: h.update(version=2)), "header.version"),
    "digest-not-hex": (edit_header(lambda h: h["digests"].__setitem__(0, "Z" * 64)), "header.digests"),
    "digests-unsorted": (edit_header(lambda h: h["digests"].reverse()), "strictly increasing"),
    "sizes-short": (edit_header(lambda h: h["sizes"].pop()), "header.sizes"),
    "size-not-int": (edit_header(lambda h: h["sizes"].__setitem__(0, 1.5)), "header.sizes"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_decoder_refuses(pool, case):
    fn, match = CORRUPT[case]
    with pytest.raises(StateFormatError, match=match):
        FragmentSet.from_bytes(fn(FragmentSet(pool[:3]).to_bytes()))


def test_decoder_refuses_mixed_geometry(pool, geometry_for):
    a, b = FragmentSet(pool[:1]), FragmentSet([Fragment.of(synthetic(geometry_for("qwen2"), 1))])
    ha, body_a = parts(a.to_bytes())
    hb, body_b = parts(b.to_bytes())
    pairs = sorted([(ha["digests"][0], ha["sizes"][0], body_a), (hb["digests"][0], hb["sizes"][0], body_b)])
    data = rebuild({**ha, "digests": [p[0] for p in pairs], "sizes": [p[1] for p in pairs]},
                   b"".join(p[2] for p in pairs))
    with pytest.raises(StateFormatError, match=r"fragments\[1\]: geometry differs"):
        FragmentSet.from_bytes(data)


@pytest.mark.parametrize("obj", ["text", None, 3])
def test_decoder_refuses_non_bytes(obj):
    with pytest.raises(StateFormatError, match="bytes"):
        FragmentSet.from_bytes(obj)


def test_a_fragment_with_a_nan_or_infinity_is_refused(llama_geometry):
    """A NaN key would make CanonicalMerge's sort keys incomparable, so its order (and the rendered bytes) would
    depend on arrival order: refused when the fragment is made, naming the tensor."""
    state = synthetic(llama_geometry, 0)
    layers = list(state.layers)
    layers[1] = LayerKV(layers[1].keys.clone().index_fill_(1, torch.tensor([0]), float("nan")), layers[1].values,
                        layers[1].positions)
    with pytest.raises(StateFormatError, match="layers.1.keys holds a NaN or an infinity"):
        Fragment(state._replace(layers=tuple(layers)))
    with pytest.raises(StateFormatError, match="latents holds a NaN"):
        Fragment(state._replace(latents=torch.full_like(state.latents, float("inf"))))
    Fragment(state)  # finite: fine
