"""Short CacheBack variant names, as `inspect` and the recall benchmarks name their columns.

    SELECTOR[@PRESET][+CALIBRATION][/sentence][:FIELD=VALUE]...

"cacheback+generic/sentence" = selector "cacheback", calibration "generic", span_mode "sentence";
"cacheback@deep+generic" = contrastive scores (the "deep" preset, calibrated); "cacheback/sentence:probe=16" =
the answer probe. `variant_fields` turns a name into CacheBack's flat keywords, which build its stages
(stages/spec.py): one more way to write the same specs, not a second set of rules.
"""
from __future__ import annotations

import ast

from ..errors import ConfigError, UnknownNameError

# Named CacheBack scoring settings. "deep": mean query attention (p = 0) read on the deeper half of the layers only;
# with generic calibration it is contrastive CacheBack (docs/methods.md).
SCORING_PRESETS = {"deep": {"p": 0.0, "min_depth": 0.5}}


def spec_fields(items: list[str]) -> dict:
    """`["probe=16", "context='lead'"]` -> {"probe": 16, "context": "lead"} (a bare word stays a string)."""
    fields = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not (eq and key.isidentifier()):
            raise ConfigError(f"variant field {item!r}: expected FIELD=VALUE, e.g. probe=16")
        try:
            fields[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            fields[key] = value
    return fields


def variant_fields(spec: str, **fields) -> dict:
    """CacheBack's keyword arguments for a variant name; keyword `fields` win over the name's."""
    spec, *extra = spec.split(":")
    fields = spec_fields(extra) | fields
    head, slash, mode = spec.partition("/")
    head, _, calibration = head.partition("+")
    selector, at, preset = head.partition("@")
    if slash and mode != "sentence":
        raise UnknownNameError("span mode suffix", mode, ["sentence"])
    if at and preset not in SCORING_PRESETS:
        raise UnknownNameError("scoring preset", preset, SCORING_PRESETS)
    params = (dict(SCORING_PRESETS[preset]) if at else {}) | fields.pop("selector_params", {})
    return {"selector": selector, "calibration": calibration or "none", "span_mode": mode or "fixed",
            **({"selector_params": params} if params else {})} | fields
