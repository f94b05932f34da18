"""Translators on the real SmolLM2 (same-model pair): zero-init identity end to end, a working dense path, and
cacheback_x's translated delivery."""
from __future__ import annotations

import pytest

from latentwire.bench.tasks.pairs import pairs
from latentwire.protocols.pair import get_pair_protocol
from latentwire.translate import build

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair():
    return pairs("facts", "test", 1)[0]


@pytest.mark.parametrize("method", ["xkv", "lcfx"])
def test_untrained_translator_answers_exactly_like_the_receiver_alone(smollm2, pair, method, tmp_path):
    g = smollm2.geometry
    build(method, g, g).save(tmp_path)
    alone = get_pair_protocol("alone", max_new_tokens=12)
    translated = get_pair_protocol("translated", checkpoint=str(tmp_path), max_new_tokens=12)
    args = (smollm2, smollm2, pair.sharer_doc, pair.receiver_doc, pair.question)
    a, b = alone.run(*args), translated.run(*args)
    assert a.answer and a.answer == b.answer
    assert b.details["parameters"] > 0 and b.details["translator_ms"] > 0


def test_dense_translation_is_a_cache_the_receiver_reads(smollm2, pair, tmp_path):
    g = smollm2.geometry
    build("dense", g, g).save(tmp_path)
    ctx = {}
    for aware in (False, True):
        out = get_pair_protocol("translated", checkpoint=str(tmp_path), context_aware=aware, max_new_tokens=8).run(
            smollm2, smollm2, pair.sharer_doc, pair.receiver_doc, pair.question)
        d = out.details
        ctx[aware] = out.receiver_context
        assert d["receiver_rows"] > d["sharer_rows"] and out.receiver_context > d["receiver_rows"]  # translated + own
    assert ctx[True] > ctx[False]  # context-aware: the receiver also read the sharer's document


def test_cacheback_x_translated_delivery_end_to_end(smollm2, tmp_path):
    """Readers select as CacheBack does and send their selection's K/V through a (here untrained) dense translator;
    the receiver attends to exactly those rows before its prompt."""
    from latentwire.protocols import get_protocol

    g = smollm2.geometry
    build("dense", g, g, context_aware=False).save(tmp_path)
    docs = ["Ana Silva leads the Heron project. The Heron project is based in Porto, near the river.",
            "Bruno Novak leads the Kestrel project. The Kestrel project is based in Oslo."]
    proto = get_protocol("cacheback_x", ratio=4, latent_steps=2, delivery="translated", translator=str(tmp_path),
                         max_new_tokens=6)
    out = proto.run([smollm2, smollm2], docs, smollm2, "Where is the Heron project based?")
    sent = [t["sent"] for t in out.details["senders"]]
    assert [t["translated_rows"] for t in out.details["senders"]] == sent
    assert out.details["translated_rows"] == out.details["message_rows"] == sum(sent)
    assert out.message_bytes == sum(sent) * g.num_layers * 2 * g.num_kv_heads * g.head_dim * 4  # fp32 K and V
    assert out.receiver_context > sum(sent) and all(k for k in out.kept_spans)
