"""One registry behind every name lookup: unknown names and misspelt parameters are typed errors that list
what is valid, for protocols, pair protocols, selectors, renders and translators alike."""
import pickle
import re
from dataclasses import dataclass, field

import pytest

from latentwire.errors import ConfigError, LatentWireError, UnknownNameError, UnknownParameterError
from latentwire.merge import RENDERS, get_render
from latentwire.protocols import PROTOCOLS, get_protocol
from latentwire.protocols.pair import PAIR_PROTOCOLS, get_pair_protocol
from latentwire.registry import Registry, parameters
from latentwire.select import SELECTORS, get_selector
from latentwire.translate import TRANSLATORS, build


def toy_registry():
    reg = Registry("toy")

    @reg.register
    @dataclass
    class Alpha:
        name = "alpha"
        ratio: int = 4
        steps: int = 0
        cache: dict = field(default_factory=dict, init=False)

        def __post_init__(self):
            if self.ratio < 1:
                raise ValueError(f"ratio must be ≥ 1, got {self.ratio}")

    @reg.register
    class Beta:
        name = "beta"

        def __init__(self, width: int = 2, *, depth: int = 1):
            self.width, self.depth = width, depth

    @reg.register
    class Gamma:
        name = "gamma"

        def __init__(self, **anything):
            self.anything = anything

    return reg


def test_register_names_lookup_and_create():
    reg = toy_registry()
    assert reg.names() == ["alpha", "beta", "gamma"] and "alpha" in reg and reg["beta"].name == "beta"
    assert reg.create("alpha", ratio=8).ratio == 8
    assert reg.create("beta", depth=3).depth == 3
    assert reg.create("gamma", whatever=1).anything == {"whatever": 1}  # **kwargs: nothing to check
    assert parameters(reg["alpha"]) == ["ratio", "steps"]  # init=False fields are not parameters
    assert parameters(reg["beta"]) == ["width", "depth"] and parameters(reg["gamma"]) is None
    assert parameters(RENDERS["bag"]) == ["order"]  # a dataclass that writes its own __init__


def test_unknown_name_lists_the_valid_names():
    reg = toy_registry()
    for call in (lambda: reg["delta"], lambda: reg.create("delta")):
        with pytest.raises(UnknownNameError) as e:
            call()
        assert isinstance(e.value, KeyError) and str(e.value) == "unknown toy 'delta'; valid: alpha, beta, gamma"


def test_misspelt_parameter_names_it_and_lists_the_fields():
    reg = toy_registry()
    with pytest.raises(UnknownParameterError) as e:
        reg.create("alpha", ratoi=8)
    err = e.value
    assert isinstance(err, TypeError) and isinstance(err, ConfigError) and isinstance(err, LatentWireError)
    assert (err.kind, err.name, err.param, err.valid) == ("toy", "alpha", "ratoi", ["ratio", "steps"])
    assert str(err) == "toy alpha has no parameter 'ratoi' (did you mean 'ratio'?); valid: ratio, steps"
    with pytest.raises(UnknownParameterError, match="'cache'"):  # not an init field
        reg.create("alpha", cache={})
    with pytest.raises(UnknownParameterError, match="valid: width, depth"):
        reg.create("beta", height=1)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is UnknownParameterError and str(again) == str(err)


def test_bad_values_become_config_errors():
    with pytest.raises(ConfigError, match="toy alpha: ratio must be ≥ 1"):
        toy_registry().create("alpha", ratio=0)


@pytest.mark.parametrize("registry, get, kind, name, param", [
    (PROTOCOLS, get_protocol, "protocol", "cacheback", "ratio"),
    (PAIR_PROTOCOLS, get_pair_protocol, "pair protocol", "t2t", "max_note_tokens"),
    (SELECTORS, get_selector, "selector", "cacheback", "p"),
    (RENDERS, get_render, "render", "canonical", "layer"),
    (TRANSLATORS, lambda name, **kw: build(name, None, None, **kw), "translator", "xkv", "dim"),
])
def test_every_registry_goes_through_it(registry, get, kind, name, param):
    assert isinstance(registry, Registry) and registry.kind == kind and name in registry.names()
    with pytest.raises(UnknownNameError) as e:
        get("no-such-name")
    assert str(e.value) == f"unknown {kind} 'no-such-name'; valid: {', '.join(registry.names())}"
    typo = param[:-1] + param[-1] * 2  # "ratio" -> "ratioo"
    with pytest.raises(UnknownParameterError) as e:
        get(name, **{typo: 1})
    assert e.value.param == typo and param in e.value.valid and f"did you mean {param!r}" in str(e.value)


def test_get_protocol_misspelt_ratio():
    with pytest.raises(UnknownParameterError, match=r"protocol cacheback has no parameter 'ratoi' "
                                                    r"\(did you mean 'ratio'\?\); valid: .*ratio"):
        get_protocol("cacheback", ratoi=8)
    assert get_protocol("cacheback", ratio=8).ratio == 8


@pytest.mark.parametrize("params, message", [
    ({"ratio": "8"}, "ratio must be float, got '8' (str)"),
    ({"latent_steps": 2.5}, "latent_steps must be int"),
    ({"query_aware": 1}, "query_aware must be bool"),
    ({"fuse": 3}, "fuse must be str or None"),
])
def test_scalar_fields_are_type_checked_before_range_checks(params, message):
    from latentwire.errors import ConfigError
    from latentwire.protocols import get_protocol

    with pytest.raises(ConfigError, match=re.escape(message)):
        get_protocol("cacheback", **params)
    assert get_protocol("cacheback", ratio=8, fuse=None).ratio == 8  # an int is a float; None where Optional
