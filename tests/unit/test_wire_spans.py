"""Wire format version 2: spans (cross-model CacheBack) round trip byte-identically; the decoder names the field."""
import pytest
import torch

from latentwire import wire
from latentwire.agent import Agent
from latentwire.errors import GeometryMismatchError
from latentwire.merge import FragmentSet
from latentwire.message import SEPARATOR, Spans
from latentwire.wire import WireFormatError

import test_wire
from test_wire import SEL, _poke, _set, forge, split

# test_wire.py's module-scoped fixtures, shared by name (each module builds its own instances)
llama, state, kept, rows, msg = test_wire.llama, test_wire.state, test_wire.kept, test_wire.rows, test_wire.msg


# -- spans (cross-model CacheBack): version 2 ----------------------------------------------------------
DOC = "Ana Silva leads the Heron project. Le café — 猫 — was closed."


def test_spans_round_trip_is_byte_identical(llama, rows, state, models, tokenizer):
    g = llama.geometry
    bodies = [Spans.of(DOC, [(0, 9), (35, 47)], index=2), Spans.of(DOC, []),
              Spans.of(DOC, [(20, 25)], 1, latents=rows.embeds[-1:]),
              Spans.of(DOC, [(0, 3)], latents=rows.embeds[-1:].half()),
              Spans.of(DOC, [(0, 3)], latents=rows.embeds[:0])]
    other = Agent(models["gemma3"], tokenizer, model_name="gemma3").geometry
    for body in bodies:
        data = wire.encode(body, protocol="cacheback_x", sender_geometry=g, selection=SEL)
        m = wire.decode(data, expect=other)  # spans fit any receiver (the latent map checks the pair)
        kind = "spans" if body.latents is None else "spans_latent"
        assert m.encoding == kind and m.header["version"] == 2 and split(data)[0]["version"] == 2
        assert m.positions is None and m.dtype == (None if body.latents is None else str(body.latents.dtype)[6:])
        got = m.body
        assert (got.text, got.spans, got.document, got.space) == (body.text, body.spans, body.document,
                                                                  (g.model, g.tokenizer))
        assert (got.latents is None) == (body.latents is None)
        assert body.latents is None or (torch.equal(got.latents, body.latents)
                                        and got.latents.dtype == body.latents.dtype)
        assert m.to_bytes() == data and wire.encode(m) == data
    assert wire.decode(data, device="cpu").body.latents.shape == (0, g.hidden_size)
    with pytest.raises(GeometryMismatchError, match="^sender"):  # rows of another model cannot claim this sender
        wire.encode(Spans.of(DOC, [(0, 3)], space=("gemma3", g.tokenizer)), protocol="x", sender_geometry=g)


def test_older_encodings_are_still_version_1(llama, state, rows, msg):
    g = llama.geometry
    for data in (msg, wire.encode(rows, protocol="cb", sender_geometry=g, encoding="token_ids"),
                 wire.encode(state.select(range(3)), protocol="fullkv"),
                 wire.encode("hi", protocol="t", sender_geometry=g),
                 wire.encode(FragmentSet.of(state.select([0])), protocol="merge")):
        assert split(data)[0]["version"] == 1 and wire.decode(data).to_bytes() == data
    assert wire.VERSION == 2 and wire.ENCODING_VERSIONS["spans"] == wire.ENCODING_VERSIONS["spans_latent"] == 2


def test_spans_decoder_names_the_field(llama, rows):
    g = llama.geometry
    text = wire.encode(Spans.of(DOC, [(0, 9), (35, 46)]), protocol="cacheback_x", sender_geometry=g)  # ends in 猫
    lat = wire.encode(Spans.of(DOC, [(0, 9)], latents=rows.embeds[-2:]), protocol="cacheback_x", sender_geometry=g)
    spans = lambda v: lambda t: t.__setitem__("spans", torch.tensor(v, dtype=torch.int64))  # noqa: E731
    cases = [
        (text, dict(header=_set(["version"], 1)), "header.version"),  # spans are version 2 only
        (text, dict(header=_set(["version"], 3)), "header.version"),
        (text, dict(header=_set(["encoding"], "rows")), "header.version"),
        (text, dict(header=_set(["dtype"], "float32")), "header.dtype"),
        (text, dict(header=_set(["positions"], [0, 1])), "header.positions"),
        (text, dict(tensors=spans([[0, 9], [9, 19]])), "tensors.spans"),  # touching spans are one span
        (text, dict(tensors=spans([[35, 46], [0, 9]])), "tensors.spans"),  # out of order
        (text, dict(tensors=spans([[0, 10], [35, 46]])), "tensors.spans"),  # the text has 9 characters there
        (text, dict(tensors=spans([[0, 9, 1]])), "tensors.spans"),
        (text, dict(tensors=lambda t: t.__setitem__("spans", t["spans"].int())), "tensors.spans"),
        (text, dict(tensors=lambda t: t.__setitem__("text", t["text"][:-1])), "tensors.text"),  # cut inside 猫
        (text, dict(tensors=lambda t: t.__setitem__("text", t["text"][:5])), "tensors.spans"),
        (text, dict(tensors=_poke("text", 9, ord("|"))), "tensors.spans"),  # the separator overwritten
        (text, dict(tensors=_poke("document", 0, -1)), "tensors.document"),
        (text, dict(tensors=lambda t: t.__setitem__("document", torch.zeros(2, dtype=torch.int64))),
         "tensors.document"),
        (text, dict(tensors=lambda t: t.__setitem__("latents", rows.embeds[-1:])), "tensors"),
        (lat, dict(tensors=lambda t: t.pop("latents")), "tensors"),
        (lat, dict(tensors=lambda t: t.__setitem__("latents", t["latents"][:, :32])), "tensors.latents"),
        (lat, dict(tensors=_poke("latents", 3, float("nan"))), "tensors.latents"),
        (lat, dict(header=_set(["dtype"], None)), "header.dtype"),
    ]
    assert split(text)[1]["text"][9:9 + len(SEPARATOR.encode())].numpy().tobytes() == SEPARATOR.encode()
    for data, kw, field in cases:
        with pytest.raises(WireFormatError) as e:
            wire.decode(forge(data, **kw))
        assert e.value.field == field, str(e.value)
