"""A closed-form map from one model's latent rows to another model's input embeddings (cross-model CacheBack).

A sender's latent rows are its last-layer hidden states taken to its own input space by its latent mode
(`Agent.latent_vector`: the state rescaled, or LatentMAS's W_a then rescaled, to the mean token-embedding
norm): each stands for the next input the sender would read. Within one model W_a maps an output-space
vector to the input embedding of the token it predicts. `fit_latent_map` fits the cross-model counterpart
on text that both models read:

    x_t = sender.latent_vector(h_t, mode)                          (d_A,)  the latent row of sender token t
    y_t = receiver.embed(receiver token aligned to sender token t + shift)   (d_B,)

shift = 1 (default): h_t predicts token t + 1, so its latent row stands for that token's input embedding
(what W_a targets within one model); shift = 0 targets token t itself. The inputs are the sender's own
latent rows, not raw hidden states, so the map reads exactly what a CacheBack sender sends. Tokens are
aligned through characters (`token_alignment.align`: the receiver token that covers the sender token's
last content character; template tokens have no partner and are skipped as targets).

Ridge regression with an intercept, solved in closed form in float64 on the host:

    W = (Xcᵀ Xc + λ I)⁻¹ Xcᵀ Yc,   b = ȳ - x̄ W,   λ = ridge · mean(diag(Xcᵀ Xc))   (Xc, Yc centred)

λ is relative to the data's scale, as `Agent.realign_matrix`'s. Sums are accumulated text by text
(`RidgeStats`), so memory is O(d²) whatever the number of tokens.

A map is bound to its pair: `check`, `apply(sender=, receiver=)` and `load(expect=)` raise
LatentMapMismatchError (a GeometryMismatchError) naming both pairs for any other sender or receiver.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

import safetensors.torch
import torch
from safetensors import SafetensorError

from ..agent import LATENT_MODES
from ..errors import (CheckpointError, ConfigError, ContextOverflowError, GeometryMismatchError, StateFormatError,
                      UnknownNameError)
from ..state import Geometry, check_format
from .token_alignment import Chat, align

FORMAT = "latentwire.latent_map"
VERSION = 1
WEIGHTS, CONFIG = "latent_map.safetensors", "latent_map.json"
SHIFTS = (0, 1)


class LatentMapMismatchError(GeometryMismatchError):
    """A latent map used for (or loaded for) a pair of models it was not fitted for; names both pairs."""


@dataclass(frozen=True, eq=False)
class LatentMap:
    """x (d_A,) in the sender's latent-row space -> x W + b (d_B,) in the receiver's input-embedding space."""

    sender: Geometry
    receiver: Geometry
    weight: torch.Tensor  # (d_A, d_B) float32
    bias: torch.Tensor  # (d_B,) float32, on the weight's device
    ridge: float  # relative ridge the map was fitted with
    samples: int  # aligned token pairs it was fitted on
    latent_mode: str = "rescale"  # how the sender's hidden states became latent rows (must match the sender's)
    shift: int = 1  # target: the receiver token aligned to sender token t + shift
    texts: int = 0  # texts it was fitted on

    def __post_init__(self):
        d_a, d_b = self.sender.hidden_size, self.receiver.hidden_size
        if tuple(self.weight.shape) != (d_a, d_b) or tuple(self.bias.shape) != (d_b,):
            raise StateFormatError(f"latent map {self.pair}: want weight ({d_a}, {d_b}) and bias ({d_b},), got "
                                   f"{tuple(self.weight.shape)} and {tuple(self.bias.shape)}")
        if self.weight.dtype != torch.float32 or self.bias.dtype != torch.float32:
            raise StateFormatError(f"latent map {self.pair}: weight and bias are float32, got "
                                   f"{self.weight.dtype} and {self.bias.dtype}")
        if self.bias.device != self.weight.device:
            raise StateFormatError(f"latent map {self.pair}: weight on {self.weight.device}, bias on "
                                   f"{self.bias.device}")
        if not (torch.isfinite(self.weight).all() and torch.isfinite(self.bias).all()):
            raise StateFormatError(f"latent map {self.pair}: non-finite weights")
        if not (isinstance(self.ridge, (int, float)) and math.isfinite(self.ridge) and self.ridge >= 0):
            raise StateFormatError(f"latent map {self.pair}: ridge must be a finite number ≥ 0, got {self.ridge!r}")
        for k in ("samples", "texts"):
            v = getattr(self, k)
            if type(v) is not int or v < 0:
                raise StateFormatError(f"latent map {self.pair}: {k} must be an integer ≥ 0, got {v!r}")
        if self.latent_mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", self.latent_mode, LATENT_MODES)
        if self.shift not in SHIFTS:
            raise StateFormatError(f"latent map {self.pair}: shift must be one of {SHIFTS}, got {self.shift!r}")

    @property
    def pair(self) -> str:
        return f"{self.sender.model} -> {self.receiver.model}"

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def to(self, device: torch.device | str) -> "LatentMap":
        return replace(self, weight=self.weight.to(device), bias=self.bias.to(device))

    # -- the pair ------------------------------------------------------------------------------
    def check(self, sender=None, receiver=None) -> None:
        """LatentMapMismatchError naming both pairs unless `sender` / `receiver` (a Geometry, an Agent or a
        (model, tokenizer) pair; None: not checked) are the models this map was fitted for."""
        diffs, given = [], []
        for role, want, got in (("sender", self.sender, sender), ("receiver", self.receiver, receiver)):
            if got is None:
                given.append("(unchecked)")
                continue
            model, tokenizer, hidden = _identity(got)
            given.append(model)
            if (model, tokenizer) != (want.model, want.tokenizer):
                diffs.append(f"{role} is {model} (tokenizer {tokenizer[:12]}), the map's is {want.model} "
                             f"(tokenizer {want.tokenizer[:12]})")
            elif hidden is not None and hidden != want.hidden_size:
                diffs.append(f"{role} hidden size {hidden}, the map's {want.hidden_size}")
        if diffs:
            raise LatentMapMismatchError(f"latent map fitted for sender {self.sender.model} -> receiver "
                                         f"{self.receiver.model}, used for sender {given[0]} -> receiver {given[1]}: "
                                         + "; ".join(diffs) + " (fit one for this pair: fit_latent_map)")

    @torch.no_grad()
    def apply(self, latents: torch.Tensor, sender=None, receiver=None) -> torch.Tensor:
        """(G, d_A) sender latent rows -> (G, d_B) float32 rows in the receiver's input space, on the map's
        device. `sender` / `receiver`: checked first when given (see `check`)."""
        self.check(sender, receiver)
        d_a = self.sender.hidden_size
        if latents.dim() != 2 or latents.shape[1] != d_a:
            raise LatentMapMismatchError(f"latent map {self.pair} reads ({d_a},) rows of {self.sender.model}, got "
                                         f"latents of shape {tuple(latents.shape)}")
        return latents.to(self.device, torch.float32) @ self.weight + self.bias  # (G, d_B)

    # -- files -----------------------------------------------------------------------------------
    def header(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "sender": self.sender.to_json(),
                "receiver": self.receiver.to_json(), "ridge": float(self.ridge), "samples": self.samples,
                "texts": self.texts, "latent_mode": self.latent_mode, "shift": self.shift}

    def save(self, folder: str | Path) -> Path:
        """Write `latent_map.safetensors` (weight, bias) and `latent_map.json` (both geometries, with their
        model names and tokenizer fingerprints, and how it was fitted) to `folder`; returns it."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {"weight": self.weight.detach().cpu().contiguous(), "bias": self.bias.detach().cpu().contiguous()}
        safetensors.torch.save_file(tensors, folder / (WEIGHTS + ".tmp"))
        (folder / (WEIGHTS + ".tmp")).replace(folder / WEIGHTS)
        (folder / (CONFIG + ".tmp")).write_text(json.dumps(self.header(), indent=2) + "\n")
        (folder / (CONFIG + ".tmp")).replace(folder / CONFIG)
        return folder

    @staticmethod
    def read_header(folder: str | Path) -> dict:
        """The header of `save`'s folder, its format checked (StateFormatError naming the file otherwise): what a
        protocol reads when it is built, before it loads the map's weights at its first question."""
        path = Path(folder) / CONFIG
        try:
            header = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError) as e:
            raise CheckpointError(f"{path}: no latent map here (missing {CONFIG})") from e
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not JSON ({e})") from e
        try:
            check_format(header, FORMAT, VERSION)
        except StateFormatError as e:  # another format or version: unusable here
            raise CheckpointError(f"{path}: {e}") from e
        return header

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str | None = None, expect=None) -> "LatentMap":
        """A map from `save`'s folder, its tensors on `device` (None: the host). `expect`: (sender, receiver)
        to check it against (see `check`), so a map for another pair is refused before it is used."""
        header = cls.read_header(folder)
        try:
            tensors = safetensors.torch.load_file(Path(folder) / WEIGHTS)  # on the host
            out = cls(Geometry.from_json(header["sender"]), Geometry.from_json(header["receiver"]),
                      tensors["weight"], tensors["bias"], header["ridge"], header["samples"],
                      header["latent_mode"], header["shift"], header["texts"])
        except (KeyError, TypeError, ValueError, OSError, SafetensorError) as e:
            raise CheckpointError(f"{folder}: malformed latent map ({type(e).__name__}: {e})") from e
        if expect is not None:
            out.check(*expect)
        return out if device is None else out.to(device)


def _identity(x) -> tuple[str, str, int | None]:
    """(model, tokenizer, hidden size or None) of a Geometry, an Agent or a (model, tokenizer) pair."""
    g = x if isinstance(x, Geometry) else getattr(x, "geometry", None)
    if isinstance(g, Geometry):
        return g.model, g.tokenizer, g.hidden_size
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(s, str) for s in x):
        return x[0], x[1], None
    raise TypeError(f"want a Geometry, an Agent or (model, tokenizer), got {type(x).__name__}")


# -- fitting ---------------------------------------------------------------------------------------
class RidgeStats:
    """Running sums for ridge regression with an intercept: n, Σx, Σy, XᵀX, XᵀY (float64, on the host:
    float64 runs everywhere there, and the sums are O(d²) whatever the number of samples)."""

    def __init__(self, d_in: int, d_out: int):
        if d_in < 1 or d_out < 1:
            raise ConfigError(f"dimensions must be ≥ 1, got {d_in}, {d_out}")
        self.d_in, self.d_out, self.n = d_in, d_out, 0
        self.sx = self.sy = self.xx = self.xy = None  # (d_in,), (d_out,), (d_in, d_in), (d_in, d_out) after `add`

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add n samples: x (n, d_in), y (n, d_out)."""
        if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0] or (x.shape[1], y.shape[1]) != (
                self.d_in, self.d_out):
            raise StateFormatError(f"want x (n, {self.d_in}) and y (n, {self.d_out}), got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        x, y = x.detach().cpu().double(), y.detach().cpu().double()  # on the host, float64
        sums = (x.sum(0), y.sum(0), x.T @ x, x.T @ y)
        if self.sx is None:
            self.sx, self.sy, self.xx, self.xy = sums
        else:
            for total, part in zip((self.sx, self.sy, self.xx, self.xy), sums):
                total += part
        self.n += x.shape[0]

    def solve(self, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(W (d_in, d_out), b (d_out,)) float64 minimising |Y - XW - b|² + λ|W|²,
        λ = ridge · mean(diag(XcᵀXc))."""
        if not (math.isfinite(ridge) and ridge >= 0):
            raise ConfigError(f"ridge must be a finite number ≥ 0, got {ridge}")
        if self.n < 2:
            raise ConfigError(f"ridge regression needs ≥ 2 samples, got {self.n}")
        mx, my = self.sx / self.n, self.sy / self.n  # (d_in,), (d_out,)
        xx = self.xx - self.n * torch.outer(mx, mx)  # (d_in, d_in) centred
        xy = self.xy - self.n * torch.outer(mx, my)  # (d_in, d_out) centred
        lam = ridge * float(xx.diagonal().mean())
        eye = torch.eye(xx.shape[0], dtype=torch.float64, device=xx.device)
        w = torch.linalg.lstsq(xx + lam * eye, xy, driver="gelsd").solution  # rank-deficient safe
        return w, my - mx @ w


def fit_ridge(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge fit of y (n, d_out) ≈ x (n, d_in) W + b; returns float64 (W, b) on the host."""
    stats = RidgeStats(x.shape[-1], y.shape[-1])
    stats.add(x, y)
    return stats.solve(ridge)


def latent_rows(agent, hidden: torch.Tensor, mode: str = "rescale") -> torch.Tensor:
    """`Agent.latent_vector` row by row: (n, d) last-layer hidden states -> (n, d) latent rows."""
    if mode not in LATENT_MODES:
        raise UnknownNameError("latent mode", mode, LATENT_MODES)
    v = hidden @ agent.realign_matrix if mode == "realign" else hidden  # (n, d)
    return v * (agent.mean_embedding_norm / v.norm(dim=-1, keepdim=True).clamp_min(1e-12))


@torch.inference_mode()
def aligned_pairs(sender, receiver, chat: Chat, latent_mode: str = "rescale", shift: int = 1
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs from one chat both agents read: x (n, d_A) the sender's latent rows at its tokens t,
    y (n, d_B) the receiver's input embeddings of the tokens aligned to sender tokens t + shift."""
    if shift not in SHIFTS:
        raise ConfigError(f"shift must be one of {SHIFTS}, got {shift}")
    a = align(sender, receiver, chat)  # per sender token: the receiver token holding its last content character
    ids = a.receiver_ids  # (T_A,) the sender's prompt ids (align's first agent is the one indexed)
    if len(ids) > sender.context_window:
        raise ContextOverflowError(len(ids), sender.context_window, {f"text ({sender.model_name})": len(ids)})
    hidden = sender._forward(sender.new_cache(), 0, ids=ids)  # (T_A, d_A) last-layer states, as `think` reads them
    x = latent_rows(sender, hidden, latent_mode)  # (T_A, d_A)
    src = torch.arange(len(ids) - shift, dtype=torch.int64, device=ids.device)  # sender token t
    keep = a.mask[src + shift]  # token t + shift holds shared content with a receiver partner
    src = src[keep]
    target = a.sharer_ids[a.index[src + shift]]  # (n,) receiver token ids
    return x[src], receiver.embed(target.to(receiver.device))  # (n, d_A), (n, d_B)


def fit_latent_map(sender, receiver, texts: Iterable[Chat], ridge: float = 1e-3, latent_mode: str = "rescale",
                   shift: int = 1) -> LatentMap:
    """Fit sender -> receiver on `texts` (chats both read; pass what senders read, e.g. SENDER_PROMPT around a
    document, so the states are those of a real read). Returns the map on the host."""
    geo_a, geo_b = sender.geometry, receiver.geometry
    stats, n_texts = RidgeStats(geo_a.hidden_size, geo_b.hidden_size), 0
    for chat in texts:
        stats.add(*aligned_pairs(sender, receiver, chat, latent_mode, shift))
        n_texts += 1
    w, b = stats.solve(ridge)
    return LatentMap(geo_a, geo_b, w.to(torch.float32), b.to(torch.float32), float(ridge), stats.n, latent_mode,
                     shift, n_texts)
