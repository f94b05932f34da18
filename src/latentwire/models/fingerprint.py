"""A tokenizer's identity: two agents may share KV rows only if their token ids mean the same text."""
from __future__ import annotations

import hashlib
import json


def tokenizer_fingerprint(tokenizer) -> str:
    """First 16 hex digits of SHA-256 over the sorted vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps({"vocab": vocab, "special": sorted(map(str, tokenizer.all_special_tokens))},
                         ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
