"""Cross-model CacheBack: a small reader model selects what the receiver's question needs from each document;
a larger model of another family answers over the selected text spans (no training; any pair of models)."""
import os

from latentwire.agent import Agent
from latentwire.protocols import get_protocol

READER = os.environ.get("LATENTWIRE_EXAMPLE_SHARER", "smollm2-135m")
ANSWERER = os.environ.get("LATENTWIRE_EXAMPLE_RECEIVER", "qwen2.5-coder-0.5b")
documents = ["Facilities log. The access code of the north warehouse is 7341. The lobby lights were replaced.",
             "Project notes. Maria Lopez leads the Falcon project, which is based in Lisbon. Lunch is on Friday.",
             "Inventory. The blue crate contains exactly 58 copper bolts. The forklift needs service in May."]
question = "Which city is the Falcon project based in?"

reader, answerer = Agent.from_pretrained(READER), Agent.from_pretrained(ANSWERER)
for name, params in [("text", {"ratio": 4}), ("cacheback_x", {"ratio": 4, "latent_steps": 8})]:
    out = get_protocol(name, **params).run([reader] * 3, documents, answerer, question)  # readers -> answerer
    print(f"{name:11} {out.message_bytes:>6,} bytes {out.tteoa:5.2f} s", repr(out.answer.strip()[:60]))
    for doc, spans in zip(documents, out.kept_spans or ()):  # what each reader sent: spans of its document
        print("   sent:", " … ".join(doc[a:b] for a, b in spans))
