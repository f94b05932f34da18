"""Translators between different frozen models (docs/methods.md#translators): XKV, dense alignment, LCF-X, C2C."""
from . import c2c, dense_alignment, lcfx, xkv  # noqa: F401  (register)
from .base import TRANSLATORS, Translator, build, load

__all__ = ["TRANSLATORS", "Translator", "build", "load"]
