"""Fan-in: three senders read private documents; CacheBack sends only the rows the receiver's question needs."""
import os

from latentwire.agent import Agent
from latentwire.protocols import get_protocol

MODEL = os.environ.get("LATENTWIRE_EXAMPLE_MODEL", "qwen2.5-coder-0.5b")
documents = ["Facilities log. The access code of the north warehouse is 7341. The lobby lights were replaced.",
             "Project notes. Maria Lopez leads the Falcon project, which is based in Lisbon. Lunch is on Friday.",
             "Inventory. The blue crate contains exactly 58 copper bolts. The forklift needs service in May."]
question = "Which city is the Falcon project based in?"

agent = Agent.from_pretrained(MODEL)  # one Agent plays every sender and the receiver
for name, params in [("alone", {}), ("text", {}), ("fullkv", {"latent_steps": 8}),
                     ("cacheback", {"ratio": 8, "latent_steps": 8})]:
    out = get_protocol(name, **params).run([agent] * 3, documents, agent, question)
    print(f"{name:9} {out.message_bytes:>10,} bytes {out.receiver_context:>4} rows {out.tteoa:5.2f} s",
          repr(out.answer.strip()[:60]))
