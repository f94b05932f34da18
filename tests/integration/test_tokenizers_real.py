"""Every bundled model's converted tokenizer adds BOS exactly when its GGUF says so (transformers releases
disagree when left to themselves)."""
import pytest

from latentwire.models import ZOO, build_cache, get_zoo_model
from latentwire.models import zoo

pytestmark = pytest.mark.integration

BOS_FIRST = {"smollm2-135m": None, "gemma3-270m": 2, "qwen2.5-coder-0.5b": None}  # from each GGUF's add_bos flag


def test_every_bundled_model_has_an_expected_bos():
    assert set(BOS_FIRST) == set(ZOO)


@pytest.mark.parametrize("name", list(ZOO))
def test_bos_follows_the_gguf(name):
    build_cache(name)
    tok = zoo._tokenizer(get_zoo_model(name).cache_dir, True, True)
    plain = tok("The code is 7341.", add_special_tokens=False)["input_ids"]
    bos = BOS_FIRST[name]
    assert tok("The code is 7341.")["input_ids"] == ([bos] if bos is not None else []) + plain
    assert tok.decode(plain) == "The code is 7341."


ROUND_TRIP = "Price: 5€ 🫨 ok <b>bold</b> 𝔘\n\n\tdef f():\n\t\treturn 1\n\n\n"


@pytest.mark.parametrize("name", list(ZOO))
def test_decoded_answers_keep_every_character(name):
    """What a model writes comes back whole: emoji and rare letters (Gemma spells them with byte pieces), HTML tags
    (user-defined pieces in Gemma's vocabulary), runs of newlines and tabs; skipping special tokens drops none."""
    build_cache(name)
    tok = zoo._tokenizer(get_zoo_model(name).cache_dir, True, True)
    ids = tok(ROUND_TRIP, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == ROUND_TRIP


def test_gemma_matches_user_defined_pieces_whole_as_sentencepiece_does():
    """Gemma's vocabulary holds runs of newlines as single pieces (107 = "\\n", 108 = "\\n\\n"): a blank line is one
    token, as the model was trained on, not two; its turn markers stay special."""
    build_cache("gemma3-270m")
    tok = zoo._tokenizer(get_zoo_model("gemma3-270m").cache_dir, True, True)
    a, b = (tok(x, add_special_tokens=False)["input_ids"][0] for x in ("a", "b"))
    assert tok("a\n\nb", add_special_tokens=False)["input_ids"] == [a, 108, b]
    assert tok("a\nb", add_special_tokens=False)["input_ids"] == [a, 107, b]
    assert {"<start_of_turn>", "<end_of_turn>"} <= set(tok.all_special_tokens)
    assert "<b>" not in tok.all_special_tokens and "<0xF0>" not in tok.all_special_tokens
