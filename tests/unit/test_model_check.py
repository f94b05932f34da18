"""`latentwire check --model M`: the geometry, then the laws the library relies on, measured on the model."""
import pytest

from latentwire import cli
from latentwire.agent import Agent
from latentwire.bench.model_check import check_model
from latentwire.models import tiny_model


def _saved(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("arch", ["gemma3", "cohere"])
def test_a_supported_model_passes_every_check(tmp_path, tokenizer, capsys, arch):
    assert cli.main(["check", "--model", _saved(tmp_path, tiny_model(arch), tokenizer), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name:10} pass" in out for name in ("rerotation", "attention", "logits", "wire")), out
    assert ("pairs (2i, 2i+1)" in out) == (arch == "cohere") and "torch.float32" in out


def test_a_layer_without_rope_fails_the_measured_law_even_if_undetected(tokenizer, monkeypatch):
    """The static NoPE detection aside, the rerotation law itself catches a layer whose keys do not rotate."""
    from transformers import AutoModelForCausalLM, SmolLM3Config

    import latentwire.rope as rope

    config = SmolLM3Config(vocab_size=264, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           num_hidden_layers=4, num_key_value_heads=2, max_position_embeddings=2048,
                           no_rope_layers=[1, 1, 1, 0], bos_token_id=1, eos_token_id=4, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config).eval()
    monkeypatch.setattr(rope, "nope_layers", lambda model: [])  # as if a new architecture hid it
    checks = {c.name: c for c in check_model(Agent(model, tokenizer, model_name="smollm3"))}
    assert not checks["rerotation"].ok and checks["rerotation"].error > 0.1
    assert "worst layer 3 of 4" in checks["rerotation"].detail
    assert checks["wire"].ok and checks["logits"].ok


def test_a_refused_model_is_a_typed_error(tmp_path, tokenizer, capsys):
    from transformers import AutoModelForCausalLM, SmolLM3Config

    config = SmolLM3Config(vocab_size=264, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           num_hidden_layers=4, num_key_value_heads=2, no_rope_layers=[1, 1, 1, 0],
                           bos_token_id=1, eos_token_id=4, pad_token_id=0)
    path = _saved(tmp_path, AutoModelForCausalLM.from_config(config), tokenizer)
    assert cli.main(["check", "--model", path, "--device", "cpu"]) == 2
    assert "UnsupportedRopeError" in capsys.readouterr().err


def test_a_failed_law_exits_1_and_a_broken_model_exits_2(tmp_path, tokenizer, capsys, monkeypatch):
    import latentwire.bench.model_check as mc

    path = _saved(tmp_path, tiny_model("llama"), tokenizer)
    monkeypatch.setattr(mc, "check_model", lambda agent: [mc.Check("rerotation", 0.5, 1e-3, "worst layer 2 of 3")])
    assert cli.main(["check", "--model", path, "--device", "cpu"]) == 1
    assert "rerotation FAIL  error 5.00e-01" in capsys.readouterr().out

    def boom(agent):
        raise RuntimeError("shape mismatch in the model's forward")

    monkeypatch.setattr(mc, "check_model", boom)
    assert cli.main(["check", "--model", path, "--device", "cpu"]) == 2
    assert "could not run on this model: RuntimeError" in capsys.readouterr().err
