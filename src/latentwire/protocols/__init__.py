"""Protocols: one file each, registered by name in `PROTOCOLS`."""
from . import alone, cacheback, cacheback_chain, fullcontext, fullkv, merge, packllm, text  # noqa: F401  (registration)
from .base import PROTOCOLS, Outcome, Protocol, get_protocol

__all__ = ["PROTOCOLS", "Outcome", "Protocol", "get_protocol"]
