"""Translate: a translator maps a sharer model's cache into a receiver of another family, which answers over it.
Untrained, XKV is the identity (zero output head); train one with `latentwire train --method xkv ...`."""
import os

import torch

from latentwire.agent import Agent
from latentwire.protocols.pair import own_prompt
from latentwire.translate import build, load
from latentwire.translate.compose import PairStates, compose

SHARER = os.environ.get("LATENTWIRE_EXAMPLE_SHARER", "gemma3-270m")
RECEIVER = os.environ.get("LATENTWIRE_EXAMPLE_RECEIVER", "smollm2-135m")
CHECKPOINT = os.environ.get("LATENTWIRE_EXAMPLE_TRANSLATOR")  # a `latentwire train` folder for this pair
question = "In which city does the leader of the Falcon project work?"

sharer, receiver = Agent.from_pretrained(SHARER), Agent.from_pretrained(RECEIVER)
translator = load(CHECKPOINT, receiver.device) if CHECKPOINT else build("xkv", sharer.geometry, receiver.geometry)
states = PairStates(sharer=sharer.prefill(own_prompt("Maria Lopez leads the Falcon project.", question)),
                    receiver=receiver.prefill(own_prompt("Maria Lopez works in Lisbon.", question)))
with torch.inference_mode():
    cache = compose(translator.to(receiver.device), states)  # receiver rows + the translator's K/V residuals
print("alone:     ", receiver.answer(question, message=states.receiver).text)
print("translated:", receiver.answer(question, message=cache).text)
if not CHECKPOINT:  # say what an untrained translator does, rather than let it look like transfer
    print("(untrained: XKV's output head starts at zero, so 'translated' is 'alone'; train one with "
          "`latentwire train --method xkv` and set LATENTWIRE_EXAMPLE_TRANSLATOR to its folder)")
