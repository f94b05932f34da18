"""The spec grammar of staged protocols, and the flat keywords every record written before stages still uses.

    cacheback(ratio=8, score=probe(16), units=sentences(context='lead'), encoding='kv')
    cacheback(ratio=8, probe=16, context='lead', encoding='kv')          the same protocol, in flat keywords

`parse_value` reads one parameter's value: a Python literal, or a stage call (`STAGE_CALLS`) whose arguments are
values in turn. `from_flat` maps the flat keywords onto stages (`FLAT`: which stage each belongs to); `to_flat`
writes a protocol's stages back as flat keywords where they can be (config.json's "parameters", so a folder written
before stages resumes), and as stage specs where they cannot.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ...errors import ConfigError, UnknownNameError
from ...registry import check_types, construct
from ...select import SELECTORS, SPAN
from .base import STAGES, Stage, stage
from .budget import Chain, Mass, Ratio
from .score import Attention, Fuse, Text, text_selectors
from .wrappers import SCORES, Calibrated, Probe
from .units import FixedSpans, Sentences

SPAN_MODES = ("fixed", "sentence")
TEXT_QUERIES = ("question", "draft")
FLAT = {"score": ("selector", "selector_params", "query_format", "probe", "probe_mix", "calibration",
                  "calibration_floor", "fuse", "fuse_k", "text_query"),
        "units": ("span", "span_mode", "unit_floor", "context", "fill"),
        "budget": ("ratio", "mass", "max_ratio"),
        "encoding": ("encoding", "recompute")}
CHAIN_FLAT = ("budget", "max_rows")  # cacheback_chain's own: its budget was a string
CROSS_FLAT = ("delivery", "latent_map", "translator")  # cacheback_x's own: its encoding was `delivery`
DELIVERIES = {"spans": "spans", "spans+latent": "spans_latent", "translated": "translated"}


@dataclass
class FlatTypes:
    """The scalar type of each flat keyword, checked as a protocol's own fields are (`check_types`)."""
    selector: str
    query_format: str
    probe: int
    probe_mix: str
    calibration: str
    calibration_floor: float
    fuse: str | None
    fuse_k: float
    text_query: str
    span: int
    span_mode: str
    unit_floor: bool
    context: str
    fill: str
    ratio: float
    mass: float | None
    max_ratio: float
    recompute: float | None
    max_rows: int
    delivery: str


def stage_calls() -> dict:
    """Name -> what builds it: every registered stage and `contrastive`."""
    return dict(STAGES) | {"contrastive": SCORES["contrastive"]}


def parse_value(node: ast.AST):
    """A parameter's value from its syntax: a Python literal, or a stage call such as `probe(16, mix='and')`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        calls = stage_calls()
        if node.func.id not in calls:
            raise UnknownNameError("stage", node.func.id, calls)
        if any(kw.arg is None for kw in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            raise ConfigError(f"stage {node.func.id}: give its parameters by name or position, not * or **")
        args = [parse_value(a) for a in node.args]
        kwargs = {kw.arg: parse_value(kw.value) for kw in node.keywords}
        return construct("stage", node.func.id, calls[node.func.id], *args, **kwargs)
    if isinstance(node, (ast.List, ast.Tuple)) and any(isinstance(e, ast.Call) for e in node.elts):
        return [parse_value(e) for e in node.elts]
    return ast.literal_eval(node)


def parse_stage(text: str) -> Stage:
    """A stage from its spec text: `parse_stage("sentences(context='lead')")`."""
    try:
        return parse_value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError) as e:
        raise ConfigError(f"bad stage spec {text!r}: {e}") from e


def _score(p: dict) -> Stage:
    sel, params = p.pop("selector", "cacheback"), p.pop("selector_params", {}) or {}
    query, probe, mix = p.pop("query_format", "turn"), p.pop("probe", 0), p.pop("probe_mix", "join")
    calibration, floor = p.pop("calibration", "none"), p.pop("calibration_floor", 0.05)
    fuse, fuse_k, text_query = p.pop("fuse", None), p.pop("fuse_k", 60.0), p.pop("text_query", "question")
    if sel not in SELECTORS:
        raise UnknownNameError("selector", sel, SELECTORS)
    if text_query not in TEXT_QUERIES:
        raise UnknownNameError("text query", text_query, TEXT_QUERIES)
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        raise ConfigError(f"probe must be an int ≥ 0 (answer tokens decoded to score with), got {probe!r}")
    if mix != "join" and not probe:
        raise ConfigError(f"probe_mix {mix!r} combines the probe's scores with the question's: it needs probe ≥ 1")
    if text_query == "draft" and not probe:
        raise ConfigError("text_query 'draft' matches the sender's answer draft: it needs probe ≥ 1")
    drafted = probe if text_query == "draft" else 0
    if sel in text_selectors():
        if fuse is not None:
            raise ConfigError(f"fuse= combines a state selector with a text one; {sel!r} is a text selector")
        for knob, on in (("calibration", calibration != "none"), ("probe", probe and not drafted),
                         ("probe_mix", mix != "join")):
            if on:
                raise ConfigError(f"{knob} needs a query-conditioned state selector, not {sel!r}")
        return construct("stage", "text", Text, selector=sel, params=params, draft=drafted)
    if drafted and fuse is None:
        raise ConfigError("text_query 'draft' is what a text selector reads: set selector= to one (lexical, bm25, "
                          "dense) or fuse= one with the state selector")
    score = construct("stage", "attention", Attention, selector=sel, params=params, query=query)
    if probe:
        score = construct("stage", "probe", Probe, tokens=probe, mix=mix, of=score)
    if calibration != "none":
        if calibration not in ("generic", "masked"):
            raise UnknownNameError("calibration", calibration, ("none", "generic", "masked"))
        score = construct("stage", "calibrated", Calibrated, background=calibration, floor=floor, of=score)
    if fuse is not None:
        if fuse not in text_selectors():
            raise UnknownNameError("text selector to fuse", fuse, text_selectors())
        score = construct("stage", "fuse", Fuse, first=score, second=Text(fuse, draft=drafted), k=fuse_k)
    return score


def _units(p: dict) -> Stage:
    span, mode = p.pop("span", SPAN), p.pop("span_mode", "sentence")
    floor, context, fill = p.pop("unit_floor", True), p.pop("context", "none"), p.pop("fill", "cut")
    if mode not in SPAN_MODES:
        raise UnknownNameError("span mode", mode, SPAN_MODES)
    if mode == "sentence":
        return construct("stage", "sentences", Sentences, span=span, context=context, fill=fill, floor=floor)
    for name, value, default in (("context", context, "none"), ("fill", fill, "cut")):
        if value != default:
            raise ConfigError(f"{name} {value!r} keeps whole sentences: it needs span_mode 'sentence'")
    if not isinstance(floor, bool):
        raise ConfigError(f"unit_floor must be True or False, got {floor!r}")
    return construct("stage", "fixed_spans", FixedSpans, span=span)


def _budget(p: dict, chain: bool) -> Stage:
    ratio, mass, max_ratio = p.pop("ratio", 8.0), p.pop("mass", None), p.pop("max_ratio", 64.0)
    if chain:
        if mass is not None:
            raise ConfigError("cacheback_chain sets each hop's budget itself and spends it exactly: mass= is for fan-in")
        return construct("stage", "chain", Chain, hops=p.pop("budget", "relative"), ratio=ratio, max_rows=p.pop("max_rows", 512))
    if mass is None:
        return construct("stage", "ratio", Ratio, ratio=ratio)
    return construct("stage", "mass", Mass, mass=mass, ratio=ratio, floor=max_ratio)


def _cross_encoding(p: dict) -> Stage:
    delivery, latent_map, translator = p.pop("delivery", "spans"), p.pop("latent_map", None), p.pop("translator", None)
    if delivery not in DELIVERIES:
        raise UnknownNameError("delivery", delivery, DELIVERIES)
    if p.pop("encoding", "rows") != "rows" or p.pop("recompute", None) is not None:
        raise ConfigError("cacheback_x sends Spans (wire encoding 'spans' or 'spans_latent') or translated K/V ('kv'), "
                          "by delivery: leave `encoding` at its default")
    if (delivery == "spans+latent") != (latent_map is not None):
        raise ConfigError("delivery 'spans+latent' needs latent_map= (a folder written by LatentMap.save, or a "
                          "LatentMap) and 'spans' takes none")
    if (delivery == "translated") != (translator is not None):
        raise ConfigError("delivery 'translated' needs translator= (a dense translator checkpoint folder, or the "
                          "translator) and the other deliveries take none")
    given = {"latent_map": latent_map} if latent_map is not None else {"translator": translator} if translator else {}
    return stage("encoding", DELIVERIES[delivery], **given)


def _encoding(p: dict, cross: bool = False) -> Stage:
    if cross and (any(k in p for k in CROSS_FLAT) or "encoding" not in p or p["encoding"] == "rows"):
        return _cross_encoding(p)
    name, recompute = p.pop("encoding", "rows"), p.pop("recompute", None)
    if isinstance(name, Stage) or recompute is None:
        return stage("encoding", name)
    if name not in ("kv_reencoded", "kv_blend"):
        raise ConfigError(f"recompute is the receiver's share of attached rows to recompute, under encodings "
                          f"'kv_reencoded', 'kv_blend'; encoding {name!r} has none")
    return stage("encoding", name, recompute=recompute)


def from_flat(params: dict, chain: bool = False, kinds=tuple(FLAT), selector: str = "cacheback",
              cross: bool = False) -> dict:
    """Stage-valued keyword arguments of the stage `kinds` a protocol has, from flat ones (`FLAT`; `selector`: the
    protocol's default); keywords of no stage pass through. A stage given both as a stage and by flat keywords is
    refused (ConfigError naming both)."""
    p, out = dict(params), {}
    if "score" not in p:
        p.setdefault("selector", selector)
    for kind, keys in FLAT.items():
        if kind not in kinds:
            continue
        if kind == "encoding":  # its flat keyword is the slot's own: a name, or a stage
            out[kind] = _encoding(p, cross)
            continue
        legacy = chain and kind == "budget" and not isinstance(p.get(kind), Stage)  # the chain's budget='fixed'
        given = [k for k in keys + (CHAIN_FLAT if chain and kind == "budget" else ()) if k in p and k != kind]
        if kind in p and not legacy:
            if given:
                raise ConfigError(f"{kind} is given as {p[kind]!r} and by flat keywords {', '.join(given)}: give one")
            out[kind] = stage(kind, p.pop(kind))
        else:
            out[kind] = _budget(p, chain) if kind == "budget" else {"score": _score, "units": _units}[kind](p)
    return out | p


def to_flat(protocol) -> dict:
    """The protocol's stages as flat keywords where each can be written so (else `{kind}: its spec`)."""
    out = {}
    for kind, write in (("score", _flat_score), ("units", _flat_units), ("budget", _flat_budget),
                        ("encoding", _flat_encoding)):
        part = getattr(protocol, kind, None)
        if isinstance(part, Stage):
            flat = write(part)
            out |= flat if flat is not None else {kind: repr(part)}
    return out


def _flat_score(s: Stage) -> dict | None:
    out = {"probe": 0, "probe_mix": "join", "calibration": "none", "calibration_floor": 0.05, "fuse": None,
           "fuse_k": 60.0, "text_query": "question", "query_format": "turn"}
    if isinstance(s, Fuse):
        if (not isinstance(s.second, Text) or isinstance(s.first, Text) or s.second.params
                or s.second.draft not in (0, s.first.drafts())):
            return None
        out |= {"fuse": s.second.selector, "fuse_k": s.k, "text_query": "draft" if s.second.draft else "question"}
        s = s.first
    if isinstance(s, Text):
        return out | {"selector": s.selector, "selector_params": s.params, "probe": s.draft,
                      "text_query": "draft" if s.draft else "question"}
    if isinstance(s, Calibrated):
        out |= {"calibration": s.background, "calibration_floor": s.floor}
        s = s.of
    if isinstance(s, Probe):
        out |= {"probe": s.tokens, "probe_mix": s.mix}
        s = s.of
    if not isinstance(s, Attention):
        return None
    return out | {"selector": s.selector, "selector_params": s.params, "query_format": s.query}


def _flat_units(u: Stage) -> dict | None:
    if isinstance(u, Sentences):
        return {"span": u.span, "span_mode": "sentence", "unit_floor": u.floor, "context": u.context, "fill": u.fill}
    return {"span": u.span, "span_mode": "fixed", "unit_floor": True, "context": "none", "fill": "cut"} \
        if isinstance(u, FixedSpans) else None


def _flat_budget(b: Stage) -> dict | None:
    if isinstance(b, Chain):
        return {"ratio": b.ratio, "mass": None, "max_ratio": 64.0, "budget": b.hops, "max_rows": b.max_rows}
    if isinstance(b, Mass):
        return {"ratio": b.ratio, "mass": b.mass, "max_ratio": b.floor}
    return {"ratio": b.ratio, "mass": None, "max_ratio": 64.0} if isinstance(b, Ratio) else None


def _flat_encoding(e: Stage) -> dict:
    if e.cross_model:
        return {"encoding": "rows", "recompute": None, "delivery": e.delivery,
                "latent_map": getattr(e, "latent_map", None), "translator": getattr(e, "translator", None)}
    default = type(e)().recompute
    return {"encoding": e.name, "recompute": None if e.recompute == default else e.recompute}


def flat_keywords(cls):
    """Class decorator for a staged protocol (after @dataclass): its constructor also takes the flat keywords
    (`from_flat`), and its signature lists both, so a misspelt one is refused naming every valid one."""
    import inspect

    init, chain, cross = cls.__init__, hasattr(cls, "hop"), getattr(cls, "cross_model", False)
    kinds = tuple(k for k in FLAT if k in cls.__dataclass_fields__)
    own = list(inspect.signature(init).parameters.values())
    flat = [k for kind in kinds for k in FLAT[kind] if k not in cls.__dataclass_fields__]
    flat += [k for k in (CHAIN_FLAT if chain else ()) + (CROSS_FLAT if cross else ()) if k not in cls.__dataclass_fields__]

    def __init__(self, **params):
        check_types("protocol", cls.name, FlatTypes, {k: v for k, v in params.items() if k in flat})
        init(self, **from_flat(params, chain, kinds, getattr(cls, "default_selector", "cacheback"), cross))

    __init__.__signature__ = inspect.Signature(
        own[:1] + [p.replace(kind=p.KEYWORD_ONLY) for p in own[1:]]
        + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in flat])
    __init__.__doc__, __init__.__qualname__ = init.__doc__, f"{cls.__qualname__}.__init__"
    cls.__init__ = __init__
    return cls
