"""Train one translator on split-evidence pairs: both models frozen, AdamW on the translator only.

    cfg = TrainConfig("xkv", "gemma3-270m", "smollm2-135m", steps=300)
    train(cfg, out="runs/translators/xkv_gemma3-270m_smollm2-135m")

Each step averages the answer loss over `batch` training pairs (dense alignment: the stage-I
reconstruction loss for its first `stage1_steps` steps, then the answer loss). Dense alignment trains
in the mode it will be used in: `context_aware` reaches the pair states, the composition (training and
validation) and the checkpoint's translator config, which then refuses the other mode. The pair order is a
pure function of (seed, step), so a run is deterministic given the seed and resumes exactly: the
folder holds the translator checkpoint (safetensors + config.json), the optimizer moments
(optimizer.safetensors) and trainer.json (step, config, loss history). Validation loss every
`eval_every` steps on pairs that never share a document with training.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import safetensors.torch
import torch

from ..agent import Agent
from ..bench.tasks.pairs import PAIR_TASKS, Pair, check_disjoint, pairs
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..registry import construct
from ..translate import TRANSLATORS, build, load
from ..translate.base import WEIGHTS, read_header
from ..translate.compose import compose
from .objective import answer_loss
from .states import StateCache, pair_states

TRAINER = "trainer.json"
OPTIMIZER = "optimizer.safetensors"
# TrainConfig fields added after runs were saved, with the value those runs had
_ADDED = {"context_aware": False, "lr_schedule": "constant", "sharer_docs": "own"}
LR_SCHEDULES = ("constant", "cosine")
SHARER_DOCS = ("own", "shuffled", "blank")  # the no-sharer control (`TrainConfig.sharer_docs`)


@dataclass(frozen=True)
class TrainConfig:
    method: str
    sharer: str
    receiver: str
    tasks: tuple[str, ...] = PAIR_TASKS
    train_n: int = 160  # pairs per task
    val_n: int = 12  # pairs per task
    steps: int = 300
    batch: int = 4  # pairs per step (gradient accumulation)
    lr: float = 1e-3
    lr_schedule: str = "constant"  # "cosine": lr · ½(1 + cos(π · step / steps)), from lr down to 0
    weight_decay: float = 0.0
    stage1_steps: int = 0  # dense only: reconstruction steps before the answer loss
    context_aware: bool = False  # dense only: the receiver answers over its own read of both documents
    # The no-sharer control: "own" (the pair's sharer document), "shuffled" (another training pair's sharer
    # document, of the same task: realistic text that cannot hold the answer) or "blank" (an empty document).
    # Trained the same way on what cannot transfer the answer, it measures what training teaches besides
    # transfer (the answer's format, the receiver's own prior): a translator beats it only by transferring.
    sharer_docs: str = "own"
    eval_every: int = 50
    seed: int = 0
    params: dict = field(default_factory=dict)  # the translator's config fields
    device: str | None = None  # where the frozen models run; None = placement.resolve's default
    dtype: str | None = None  # the frozen models' dtype; translators train in float32 either way

    def __post_init__(self):
        if self.method not in TRANSLATORS:
            raise UnknownNameError("translator", self.method, TRANSLATORS)
        bad = set(self.tasks) - set(PAIR_TASKS)
        if bad or not self.tasks:
            raise ConfigError(f"tasks: want a non-empty subset of {PAIR_TASKS}, got {self.tasks}")
        for name in ("train_n", "val_n", "steps", "batch", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.stage1_steps < 0 or (self.stage1_steps and self.method != "dense"):
            raise ConfigError("stage1_steps (reconstruction pre-training) applies to the dense method only")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise UnknownNameError("learning-rate schedule", self.lr_schedule, LR_SCHEDULES)
        if not isinstance(self.context_aware, bool) or (self.context_aware and self.method != "dense"):
            raise ConfigError(f"context_aware (a bool) applies to the dense method only; got {self.context_aware!r} "
                              f"for {self.method}")
        if self.sharer_docs not in SHARER_DOCS:
            raise UnknownNameError("sharer documents", self.sharer_docs, SHARER_DOCS)
        if self.sharer_docs == "shuffled" and min(self.train_n, self.val_n) < 2:  # one pair keeps its own document
            raise ConfigError(f"sharer_docs='shuffled' swaps documents between pairs of a task: it needs train_n and "
                              f"val_n ≥ 2, got {self.train_n} and {self.val_n}")
        if "context_aware" in self.params:
            raise ConfigError("set the dense mode with TrainConfig(context_aware=...), not in params")
        construct("translator", self.method, TRANSLATORS[self.method].Config, **self.params)  # before any model loads

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"tasks": list(self.tasks)}


def data(cfg: TrainConfig) -> tuple[list[Pair], list[Pair]]:
    """Training and validation pairs; under a no-sharer control (`sharer_docs`) their sharer documents replaced."""
    train = [p for t in cfg.tasks for p in pairs(t, "train", cfg.train_n, cfg.seed)]
    val = [p for t in cfg.tasks for p in pairs(t, "val", cfg.val_n, cfg.seed)]
    check_disjoint(train, val, [p for t in cfg.tasks for p in pairs(t, "test", cfg.val_n, cfg.seed)])
    return control_pairs(train, cfg.sharer_docs, cfg.seed), control_pairs(val, cfg.sharer_docs, cfg.seed)


def control_pairs(pairs_: list[Pair], sharer_docs: str, seed: int) -> list[Pair]:
    """`pairs_` with each sharer document kept ("own"), emptied ("blank") or replaced by the sharer document of
    another pair of the same task and split ("shuffled": a seeded rotation of a shuffled order, so no pair keeps
    its own document; `TrainConfig` refuses it with fewer than 2 pairs per task)."""
    if sharer_docs == "own":
        return list(pairs_)
    if sharer_docs == "blank":
        return [dataclasses.replace(p, sharer_doc="") for p in pairs_]
    out = list(pairs_)
    for task in dict.fromkeys(p.task for p in pairs_):
        idx = [i for i, p in enumerate(pairs_) if p.task == task]
        order = idx[:]
        random.Random(f"{seed}-{task}-control").shuffle(order)
        for a, b in zip(order, order[1:] + order[:1]):  # each takes the next one's document in the shuffled cycle
            out[a] = dataclasses.replace(pairs_[a], sharer_doc=pairs_[b].sharer_doc)
    return out


def batch_indices(n: int, seed: int, step: int, batch: int) -> list[int]:
    """Pairs of step `step`: consecutive slices of a per-epoch permutation; pure in (seed, step)."""
    out = []
    for j in range(step * batch, (step + 1) * batch):
        epoch, k = divmod(j, n)
        perm = list(range(n))
        random.Random(f"{seed}-{epoch}").shuffle(perm)
        out.append(perm[k])
    return out


def step_loss(translator, states, pair: Pair, receiver: Agent, stage: int, context_aware: bool = False) -> torch.Tensor:
    if stage == 1:  # rows paired one to one (same tokens) or by the token alignment
        return translator.reconstruction_loss(states.sharer, states.receiver_on_sharer, states.align, states.mask)
    return answer_loss(receiver, compose(translator, states, context_aware), pair.question, pair.target)


def train(cfg: TrainConfig, out: str | Path, sharer: Agent | None = None, receiver: Agent | None = None,
          cache: StateCache | None = None, progress: bool = True) -> Path:
    """Train (or resume) into `out`; returns the folder. Re-running a finished run does nothing."""
    from tqdm import tqdm

    out = Path(out)
    log = _resume_log(out, cfg)
    if log["step"] >= cfg.steps:
        return out
    sharer = sharer or Agent.from_pretrained(cfg.sharer, device=cfg.device, dtype=cfg.dtype)
    receiver = receiver or (sharer if cfg.receiver == cfg.sharer else
                            Agent.from_pretrained(cfg.receiver, device=cfg.device, dtype=cfg.dtype))
    for agent in {id(sharer): sharer, id(receiver): receiver}.values():
        agent.model.requires_grad_(False)
    cache = cache or StateCache()
    train_pairs, val_pairs = data(cfg)
    # The translator trains where it writes: on the receiver's device, its parameters in float32.
    mode = {"context_aware": cfg.context_aware} if cfg.method == "dense" else {}  # recorded in the checkpoint
    if log["step"]:
        _check_saved_steps(out, log["step"])
        translator = load(out, device=receiver.device).to(dtype=torch.float32).train()
        if mode and translator.config.context_aware is None:  # a run saved before the mode was recorded
            translator.config = dataclasses.replace(translator.config, **mode)
    else:
        translator = build(cfg.method, sharer.geometry, receiver.geometry, seed=cfg.seed, **cfg.params, **mode)
        translator = translator.to(device=receiver.device, dtype=torch.float32).train()
    if mode:
        translator.check_mode(cfg.context_aware)
    translator.check_pair(sharer.geometry, receiver.geometry)
    opt = torch.optim.AdamW(translator.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if log["step"]:
        _load_optimizer(opt, translator, out / OPTIMIZER)
    log["parameters"] = translator.num_parameters

    def states_of(pair: Pair, stage: int = 2):  # stage I reads the reconstruction target instead
        return pair_states(pair, sharer, receiver, cfg.method, cache, cfg.context_aware, stage1=stage == 1)

    t0 = now(receiver.device)
    if not log["val"]:  # step 0: the untrained translator (the receiver alone, for the residual ones)
        log["val"].append([0, validation_loss(translator, val_pairs, states_of, receiver, cfg.context_aware)])
    bar = tqdm(range(log["step"], cfg.steps), initial=log["step"], total=cfg.steps, disable=not progress,
               desc=f"{cfg.method} {cfg.sharer}->{cfg.receiver}")
    for step in bar:
        stage = 1 if step < cfg.stage1_steps else 2
        for group in opt.param_groups:  # a pure function of the step, so a resumed run follows the same schedule
            group["lr"] = lr_at(cfg, step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in batch_indices(len(train_pairs), cfg.seed, step, cfg.batch):
            pair = train_pairs[i]
            loss = step_loss(translator, states_of(pair, stage), pair, receiver, stage, cfg.context_aware) / cfg.batch
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(translator.parameters(), 1.0)
        opt.step()
        log["train"].append([step + 1, stage, total])
        bar.set_postfix(loss=f"{total:.3f}")
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            val = validation_loss(translator, val_pairs, states_of, receiver, cfg.context_aware)
            log["val"].append([step + 1, val])
            log["step"] = step + 1
            log["seconds"] = log.get("seconds", 0.0) + now(receiver.device) - t0
            t0 = now(receiver.device)
            _save(out, translator, opt, cfg, log)
    return out


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based)."""
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
    return cfg.lr


@torch.no_grad()
def validation_loss(translator, val_pairs: list[Pair], states_of, receiver: Agent,
                    context_aware: bool = False) -> float:
    translator.eval()
    losses = [float(answer_loss(receiver, compose(translator, states_of(p), context_aware), p.question, p.target))
              for p in val_pairs]
    translator.train()
    return sum(losses) / len(losses)


def resumable(cfg: TrainConfig, out: str | Path) -> int:
    """The step a run of `cfg` in `out` starts from (0: a new run, `cfg.steps`: finished); ConfigError when
    `out` holds a run with another configuration. Lets a driver check every folder before training any."""
    return _resume_log(Path(out), cfg)["step"]


def _resume_log(out: Path, cfg: TrainConfig) -> dict:
    path = out / TRAINER
    if not path.exists():
        return {"step": 0, "config": cfg.to_json(), "train": [], "val": []}
    log = json.loads(path.read_text())
    log["config"] = _ADDED | log["config"]  # runs saved before a field existed ran with its default
    if log["config"] != cfg.to_json():
        diff = {k: (log["config"].get(k), v) for k, v in cfg.to_json().items() if log["config"].get(k) != v}
        raise ConfigError(f"{out} holds a run with another configuration {diff}; use a new folder")
    return log


def _save(out: Path, translator, opt, cfg: TrainConfig, log: dict) -> None:
    """Weights, optimizer, then the log; the weights and the optimizer carry their step, so a resume can tell a save
    that died between two files (`_check_saved_steps`)."""
    stamp = {"step": str(log["step"])}
    translator.save(out, extra={"training": {"step": log["step"], "config": cfg.to_json()}}, stamp=stamp)
    tensors, meta = {}, {}
    names = {id(p): n for n, p in translator.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k, v in st.items():
                if torch.is_tensor(v) and v.dim() > 0:
                    tensors[f"{names[id(p)]}.{k}"] = v.detach().cpu().contiguous()  # serialised from the host
                else:
                    meta[f"{names[id(p)]}.{k}"] = float(v)
    safetensors.torch.save_file(tensors, out / (OPTIMIZER + ".tmp"), metadata={"scalars": json.dumps(meta)} | stamp)
    (out / (OPTIMIZER + ".tmp")).replace(out / OPTIMIZER)
    (out / (TRAINER + ".tmp")).write_text(json.dumps(log, indent=1) + "\n")
    (out / (TRAINER + ".tmp")).replace(out / TRAINER)


def _check_saved_steps(out: Path, step: int) -> None:
    """ConfigError unless the weights, their config and the optimizer were all saved at the log's `step` (a kill
    between `_save`'s files leaves them apart: resuming would not reproduce the run). Files saved before the step
    stamp existed are judged by the config alone."""
    saved = {"config.json": read_header(out).get("training", {}).get("step")}
    for name in (WEIGHTS, OPTIMIZER):
        try:
            with safetensors.safe_open(str(out / name), "pt") as f:
                stamp = (f.metadata() or {}).get("step")
        except (OSError, safetensors.SafetensorError) as e:
            raise ConfigError(f"{out / name}: unreadable ({e}); train into a new folder") from e
        if stamp is not None:
            saved[name] = int(stamp)
    if off := {name: s for name, s in saved.items() if s != step}:
        raise ConfigError(f"{out}: the training log stops at step {step} but "
                          f"{', '.join(f'{n} is from step {s}' for n, s in off.items())} (a save was interrupted); "
                          "resuming would not reproduce the run, so train into a new folder")


def _load_optimizer(opt, translator, path: Path) -> None:
    """Restore the moments saved by `_save`. They are read on the host and handed to
    `Optimizer.load_state_dict`, which moves each to its parameter's device and dtype (and keeps the
    step counters where the optimizer keeps them: on the host unless it is capturable or fused)."""
    with safetensors.safe_open(str(path), "pt") as f:
        scalars = json.loads(f.metadata()["scalars"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    index = {id(p): i for i, p in enumerate(p for group in opt.param_groups for p in group["params"])}
    state = {}
    for name, p in translator.named_parameters():
        st = {k.removeprefix(name + "."): v for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
        # scalars (the step): 0-dim host float32 tensors, as torch's own optimizer state holds them
        st |= {k.removeprefix(name + "."): torch.from_numpy(numpy.array(v, dtype=numpy.float32))
               for k, v in scalars.items() if k.rsplit(".", 1)[0] == name}
        if st:
            state[index[id(p)]] = st
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
