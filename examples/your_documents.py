"""Your own documents, one per sender:  python examples/your_documents.py "Question?" a.txt b.txt [...]"""
import os
import sys
from pathlib import Path

from latentwire.agent import Agent
from latentwire.errors import ContextOverflowError
from latentwire.protocols import get_protocol

MODEL = os.environ.get("LATENTWIRE_EXAMPLE_MODEL", "qwen2.5-coder-0.5b")
question, documents = sys.argv[1], [Path(p).read_text(encoding="utf-8") for p in sys.argv[2:]]

agent = Agent.from_pretrained(MODEL)  # one Agent may play every sender and the receiver
for name, params in [("text", {}), ("cacheback", {"ratio": 8, "latent_steps": 8}), ("fullcontext", {})]:
    try:
        out = get_protocol(name, **params).run([agent] * len(documents), documents, agent, question)
    except ContextOverflowError as e:  # refused before any compute: the others may still fit
        print(f"{name:11} does not fit: {e}. Try a larger ratio (cacheback), or fewer or shorter documents.")
        continue
    print(f"{name:11} {out.message_bytes:>10,} bytes {out.tteoa:6.2f} s", repr(out.answer.strip()))
