"""Re-rotation is exact on every bundled model, including Gemma3's real sliding-window layers.

The model runs in float64 *and* its rotary module computes cos/sin in float64 (transformers forces
float32 there, whose angle rounding at position ~1000 is ~1e-4 rad), so the comparison measures our
rotation rather than the model's own RoPE precision. Layer 0's keys depend on position only through
RoPE, so there the match must be exact to float64 rounding. Deeper layers inherit float32 noise
from the RMSNorms (transformers computes them in float32 whatever the model dtype), so they are held
to 1e-5 relative — a wrong RoPE base or a doubled scaling gives errors of order 1. The prompt is longer than Gemma3's 512-token
window, so its sliding layers hold only their last 511 rows.
"""
import gc

import pytest
import torch

from latentwire.agent import Agent
from latentwire.demo import DOCUMENTS
from latentwire.models import ZOO
from latentwire.state import KVState
from latentwire.models.compat import output_cache

pytestmark = pytest.mark.integration


def _float64_rope(rotary) -> None:
    """Replace the rotary module's forward by the same formula evaluated in float64."""
    def forward(x, position_ids, layer_type=None):
        prefix = f"{layer_type}_" if layer_type else ""
        inv_freq = getattr(rotary, f"{prefix}inv_freq").double()
        scaling = getattr(rotary, f"{prefix}attention_scaling")
        freqs = position_ids[..., None].double() * inv_freq  # (B, T, R/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    rotary.forward = forward


@pytest.mark.parametrize("name", list(ZOO))
def test_rerotation_exact_on_real_model(name):
    agent = Agent.from_pretrained(name, dtype="float32")
    agent.model.double()
    _float64_rope(agent.model.model.rotary_emb)
    ids = torch.tensor(agent.chat_ids(" ".join(DOCUMENTS * 4)))
    g, p, T = agent.geometry, 333, len(ids)
    assert T > 600
    with torch.inference_mode():
        at0 = KVState.from_cache(output_cache(agent.model(ids[None], use_cache=True)), g, ids)
        atp = KVState.from_cache(output_cache(agent.model(ids[None], position_ids=torch.arange(p, p + T)[None],
                                             use_cache=True)), g, ids, start=p)
    for i, (a, b) in enumerate(zip(at0.shift(p).layers, atp.layers)):
        assert torch.equal(a.positions, b.positions)
        scale = b.keys.abs().max().item()
        bound = 1e-12 if i == 0 else 1e-5
        assert (a.keys - b.keys).abs().max().item() <= bound * max(scale, 1.0), (name, i)
        if g.layer_types[i] == "sliding":
            assert len(b.positions) == g.sliding_window - 1 and int(b.positions[-1]) == p + T - 1
    del agent
    gc.collect()
