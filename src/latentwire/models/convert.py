"""A bundled model's GGUF to a plain Hugging Face folder: dequantised once (`dequantise`), written as fp32
safetensors + config + tokenizer under the cache directory (`write_cache`, atomically), with Gemma's tokenizer
rebuilt with its BPE merges. `zoo.py` names the models and decides when to build; this module does the build."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
import torch

from ..clock import now
from ..errors import ModelConversionError

MARKER = "latentwire-cache.json"
CACHE_VERSION = 4  # bump when every conversion changes: older caches are rebuilt (4: Gemma's user-defined pieces)
ARCH_VERSIONS = {"gemma3": 5}  # one architecture's conversion changed alone (gemma3 5: its runs of spaces); a
# global bump must exceed every entry here


def cache_version(arch: str) -> int:
    """The conversion version a cache of this architecture must carry (only that architecture's caches rebuild
    when its conversion changes)."""
    return max(CACHE_VERSION, ARCH_VERSIONS.get(arch, CACHE_VERSION))


def dequantise(entry, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) straight from a `zoo.ZooModel` entry's GGUF, every file SHA-256-checked first
    (slow: 15-50 s)."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry.check_installed()
    with tempfile.TemporaryDirectory(prefix="latentwire-gguf-") as d:
        path = entry.gguf(Path(d))  # SHA-256-checked before transformers reads a byte
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        fields = GGUFReader(str(path)).fields
        if entry.arch == "gemma3":
            tokenizer = _gemma_tokenizer(fields, tokenizer)
        _pin_bos_eos(tokenizer, fields, entry.name)
    return model.eval(), tokenizer


def _pin_bos_eos(tokenizer, fields, name: str) -> None:
    """Whether `tokenizer(text)` adds BOS / EOS, set from the GGUF's own flags (`fields`: a GGUFReader's).

    Left to transformers, it depends on the release: 5.2 gives SmolLM2 a leading BOS that its GGUF says it does
    not add, 5.25 gives none, and neither gives Gemma the BOS its GGUF asks for. Absent flags follow llama.cpp for
    the vocabularies the zoo holds: SentencePiece ("llama") adds BOS, byte-level BPE does not; neither adds EOS.
    Only the post-processor in the saved tokenizer.json carries the choice (transformers does not save the two
    flags), so a reloaded tokenizer applies it without knowing it: nothing may set those flags again."""

    def flag(key: str, default: bool) -> bool:
        field = fields.get(key)
        return default if field is None else bool(field.parts[field.data[0]][0])

    def string(key: str) -> str:
        field = fields.get(key)
        return "" if field is None else bytes(field.parts[field.data[0]]).decode()

    add_bos = flag("tokenizer.ggml.add_bos_token", string("tokenizer.ggml.model") == "llama")
    if add_bos and tokenizer.bos_token is None:
        bos = fields.get("tokenizer.ggml.bos_token_id")
        if bos is None:
            raise ModelConversionError(f"{name}'s GGUF asks for a BOS token but names none "
                                       "(tokenizer.ggml.bos_token_id)")
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(int(bos.parts[bos.data[0]][0]))
    tokenizer.add_bos_token = add_bos  # each setter rebuilds the post-processor
    tokenizer.add_eos_token = flag("tokenizer.ggml.add_eos_token", False)


def _gemma_tokenizer(fields, broken):
    """Rebuild Gemma's tokenizer with its BPE merges, and its pieces typed as SentencePiece types them.

    transformers 5.2 converts a Gemma GGUF vocabulary into a BPE tokenizer with no merges, which
    tokenises text one character at a time (a silent 4x context blow-up and a different model input).
    SentencePiece-BPE merges follow from the GGUF piece scores: merge (a, b) ranks by the score of a+b.
    Piece types (GGUF `tokenizer.ggml.token_type`): control pieces (<bos>, <end_of_turn>, ...) are special
    tokens, left out of decoded text; user-defined pieces (runs of newlines or tabs, HTML tags such as <b>)
    are matched whole wherever they occur, as SentencePiece does ("\n\n" is one token, not two), and kept in
    decoded text; byte pieces (<0xF0>) are reached by byte fallback and decode to their characters. The runs of
    spaces ("▁▁" to 31 of them, ids 138-168) are matched in the normalised text, where a space is already "▁",
    so indentation is one piece ("    return" is "▁▁▁▁", "return"), as SentencePiece and llama.cpp match them in
    the raw text; in conversions 3 and 4 it was one "▁" per space.
    """
    import numpy as np
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import generate_merges
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    scores = [float(fields["tokenizer.ggml.scores"].parts[i][0]) for i in fields["tokenizer.ggml.scores"].data]
    types = np.array([int(fields["tokenizer.ggml.token_type"].parts[i][0])
                      for i in fields["tokenizer.ggml.token_type"].data])
    vocab = broken.get_vocab()  # token -> id, with transformers' whitespace/tab renaming already applied
    id2tok = {i: t for t, i in vocab.items()}
    normal, control, user_defined = 1, 3, 4  # GGUF token types (byte pieces are 6)
    special = {id2tok[i] for i in np.flatnonzero(types != normal) if i in id2tok}
    merges = generate_merges(vocab, [(id2tok[i], scores[i]) for i in sorted(id2tok)], skip_tokens=special)
    tok = GemmaTokenizer(vocab=vocab, merges=merges, bos_token=broken.bos_token, eos_token=broken.eos_token,
                         pad_token=broken.pad_token, unk_token=broken.unk_token)
    named = (broken.bos_token, broken.eos_token, broken.pad_token, broken.unk_token)
    controls = sorted(id2tok[i] for i in np.flatnonzero(types == control)
                      if i in id2tok and not id2tok[i].startswith("<unused") and id2tok[i] not in named)
    tok.add_special_tokens({"additional_special_tokens": controls})
    pieces = [id2tok[i] for i in sorted(np.flatnonzero(types == user_defined)) if i in id2tok]
    tok.add_tokens([AddedToken(p, special=False, normalized="▁" in p) for p in pieces])  # "▁": a space, normalised
    return tok


def write_cache(entry) -> Path:
    """Dequantise and write the entry's cache folder (a temporary folder renamed into place: never half-written)."""
    from safetensors.torch import save_file

    t0 = now()
    model, tokenizer = dequantise(entry)
    entry.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.cache_dir.parent))
    try:
        state = model.state_dict()
        if model.config.get_text_config(decoder=True).tie_word_embeddings or getattr(
                model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # shares storage with the input embedding
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # GGUF-loaded configs refuse to be re-saved otherwise
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"name": entry.name, "version": cache_version(entry.arch), "pip": entry.pip,
                                                "gguf_sha256": entry.gguf_sha256,
                                                "seconds": round(now() - t0, 1)}))
        shutil.rmtree(entry.cache_dir, ignore_errors=True)
        tmp.rename(entry.cache_dir)  # atomic: a half-written cache is never visible
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry.cache_dir
