"""Every protocol spec written in a committed record, config or study page builds, through the message stages, the
protocol it built before them: the same rows selected, the same message bytes and the same receiver input, bit for
bit in float32, on shipped episodes with a tiny model.

The reference is the code before the stages, read from git at `LEGACY` (the last commit with the flat classes) and
loaded beside today's package under other module names, so both run on today's agents, reads and selectors.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from latentwire.agent import Agent
from latentwire.bench.runner import parse_protocols
from latentwire.bench.tasks import load_task
from latentwire.errors import LatentWireError
from latentwire.protocols import get_protocol
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import CacheBack
from latentwire.protocols.reads import shared_reads
from latentwire.registry import construct
from latentwire.translate.latent_map import fit_latent_map

ROOT = Path(__file__).resolve().parents[2]
LEGACY = "65bd5a9"  # main before the stages (issue #64)
STAGED = ("cacheback", "cacheback_x", "retrieval", "cacheback_chain")
_VARIANT_KEY = re.compile(r'"([a-z0-9_]+(?:@\w+)?(?:\+\w+)?)/(sentence|fixed)/(\d+)"')


def legacy_classes() -> dict[str, type]:
    """name -> the class as it was at LEGACY (not registered: today's registry is left alone)."""
    mods = {}
    for name in ("cacheback", "cacheback_x", "retrieval", "cacheback_chain"):
        try:
            src = subprocess.run(["git", "-C", str(ROOT), "show", f"{LEGACY}:src/latentwire/protocols/{name}.py"],
                                 check=True, capture_output=True, text=True).stdout
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            pytest.fail(f"the legacy reference needs this repository's history (commit {LEGACY}): {e}")
        src = src.replace("\n@register\n", "\n")
        for other in ("cacheback_x", "cacheback"):
            src = re.sub(rf"from \.{other} import", f"from ._legacy_{other} import", src)
        mod = types.ModuleType(f"latentwire.protocols._legacy_{name}")
        mod.__package__ = "latentwire.protocols"
        sys.modules[mod.__name__] = mod
        exec(compile(src, f"{LEGACY}:{name}.py", "exec"), mod.__dict__)
        mods[name] = mod
    return {"cacheback": mods["cacheback"].CacheBack, "cacheback_x": mods["cacheback_x"].CacheBackX,
            "retrieval": mods["retrieval"].Retrieval, "cacheback_chain": mods["cacheback_chain"].CacheBackChain}


def _walk(node, out: set):
    if isinstance(node, dict):
        if node.get("name") in STAGED and isinstance(node.get("params"), dict):
            out.add((node["name"], json.dumps(node["params"], sort_keys=True)))
        for v in node.values():
            _walk(v, out)
    elif isinstance(node, list):
        for v in node:
            _walk(v, out)


def committed_specs() -> list[tuple[str, dict]]:
    """Every distinct (protocol, params) of a staged protocol in docs/results: config.json entries, record labels
    (a cross-model label's "A→B " prefix left out) and the recall studies' variant keys ("cacheback+generic/sentence/8")."""
    found: set = set()
    for path in ROOT.glob("docs/results/**/*.json"):
        try:
            _walk(json.loads(path.read_text()), found)
        except json.JSONDecodeError:
            continue
    for path in ROOT.glob("docs/results/**/*.json*"):
        text = path.read_text()
        for head, mode, ratio in set(_VARIANT_KEY.findall(text)):
            found.add(("variant", json.dumps([head + ("/sentence" if mode == "sentence" else ""), int(ratio)])))
        if path.suffix != ".jsonl":
            continue
        labels = {json.loads(f'"{m}"') for m in re.findall(r'"protocol": "((?:[^"\\]|\\.)*)"', text)}
        for label in {x.split(" ")[-1] if "→" in x else x for x in labels}:
            if label.split("(")[0] in STAGED:
                for name, params in parse_protocols(label).values():
                    found.add((name, json.dumps(params, sort_keys=True)))
    return sorted(found)


SPECS = committed_specs()
SMALL = {"max_new_tokens": 3}


def test_the_records_hold_the_specs_this_file_checks():
    names = {n for n, _ in SPECS}
    assert {"cacheback", "cacheback_x", "retrieval", "cacheback_chain", "variant"} <= names
    assert len(SPECS) > 60


@pytest.fixture(scope="module")
def legacy():
    return legacy_classes()


def _cut(text: str, limit: int = 450) -> str:
    """The context's paragraphs that fit in `limit` characters (at least its first sentence): the tiny tokenizer
    spends about a token a character, and its model's window is 1,024."""
    keep = ""
    for para in text.split("\n\n"):
        if keep and len(keep) + 2 + len(para) > limit:
            break
        keep = f"{keep}\n\n{para}" if keep else para
    return keep if len(keep) <= limit else keep[:keep.find(". ", 0, limit) + 1 or limit]


@pytest.fixture(scope="module")
def episodes():
    """The first coref and the first facts episode, each context cut to what a tiny model reads (`_cut`)."""
    return [replace(ep, contexts=tuple(_cut(c) for c in ep.contexts), evidence=())
            for ep in load_task("coref")[:1] + load_task("facts")[:1]]


@pytest.fixture(scope="module")
def latent_map(models, tokenizer, episodes):
    agent = Agent(models["qwen2"], tokenizer, "qwen2")
    return fit_latent_map(agent, agent, [SENDER_PROMPT.format(document=d) for d in episodes[0].contexts], ridge=1e-2)


def _same(a, b, what: str):
    """Bit-for-bit equality of two message parts or receiver inputs (Rows, Spans, KVState, tensors, text)."""
    assert type(a) is type(b), what
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), what
    elif hasattr(a, "to_bytes"):
        assert a.to_bytes() == b.to_bytes(), what
    elif hasattr(a, "embeds"):
        assert torch.equal(a.embeds, b.embeds) and torch.equal(a.token_ids, b.token_ids), what
    elif hasattr(a, "spans"):
        assert (a.text, a.spans) == (b.text, b.spans), what
        assert (a.latents is None) == (b.latents is None) and (a.latents is None or torch.equal(a.latents, b.latents))
    else:
        assert a == b, what


def _build(cls_or_name, params: dict, legacy: dict):
    if cls_or_name == "variant":
        head, ratio = params
        return (construct("protocol", "cacheback", legacy["cacheback"], **_variant(head, ratio)),
                CacheBack.variant(head, ratio=ratio))
    return (construct("protocol", cls_or_name, legacy[cls_or_name], **params), get_protocol(cls_or_name, **params))


def _variant(head: str, ratio: int) -> dict:
    from latentwire.protocols.variants import variant_fields
    return variant_fields(head, ratio=ratio)


@pytest.mark.parametrize("name,params", [pytest.param(n, p, id=f"{n}:{p}", marks=[pytest.mark.kvpress] if "kvzip" in p
                                                     else []) for n, p in SPECS])
def test_a_committed_spec_builds_the_protocol_it_built_before_the_stages(name, params, legacy, episodes, models,
                                                                         tokenizer, latent_map):
    params = json.loads(params)
    if name == "cacheback_x" and params.get("delivery") == "spans+latent":
        params = params | {"latent_map": latent_map}
    params = params | SMALL if name != "variant" else params
    old, new = _build(name, params, legacy)
    if name == "variant":
        old.max_new_tokens = new.max_new_tokens = SMALL["max_new_tokens"]
    agent, ran = Agent(models["qwen2"], tokenizer, "qwen2"), 0
    for ep in episodes:
        senders, docs = [agent] * len(ep.contexts), list(ep.contexts)
        with shared_reads():  # one read serves both: the comparison is of what each does with it
            try:
                want = old.run(senders, docs, agent, ep.question)
            except LatentWireError as e:
                with pytest.raises(type(e)):
                    new.run(senders, docs, agent, ep.question)
                continue
            got, ran = new.run(senders, docs, agent, ep.question), ran + 1
            assert (got.answer, got.message_bytes, got.receiver_context) == \
                (want.answer, want.message_bytes, want.receiver_context)
            assert got.kept_spans == want.kept_spans
            if isinstance(new, CacheBack) and not hasattr(new, "hop"):
                _compare_messages(old, new, senders, docs, agent, ep.question)
            else:
                _compare_details(want.details, got.details)
    assert ran, "both refused every episode: the comparison compared nothing"


def _compare_messages(old, new, senders, docs, receiver, question):
    """Each sender's selected positions and message, then the receiver's input, bit for bit."""
    for i, (sender, doc) in enumerate(zip(senders, docs)):
        a, b = old.send_one(sender, doc, question, i), new.send_one(sender, doc, question, i)
        assert a.positions == b.positions and a.kept == b.kept, f"sender {i} selected other rows"
        _same(a.part, b.part, f"sender {i}'s message")
        assert {k: a.timing.get(k) for k in ("rows", "sent", "sent_document_rows", "probe")} == \
            {k: b.timing.get(k) for k in ("rows", "sent", "sent_document_rows", "probe")}
    parts_a = old.send(senders, docs, question)[0]
    parts_b = new.send(senders, docs, question)[0]
    _same(old.receive(receiver, question, parts_a), new.receive(receiver, question, parts_b), "receiver input")


def _compare_details(want: dict, got: dict):
    """Details without their clocks: what was sent, as counted."""
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if not k.endswith("_s") and k not in ("seconds", "shared_read")}
        return [strip(v) for v in d] if isinstance(d, list) else d
    assert strip(got) == strip(want)
