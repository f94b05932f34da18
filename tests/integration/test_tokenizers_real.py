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
