"""Protocols: one file each, registered by name in `PROTOCOLS`."""
from . import (alone, cacheback, cacheback_chain, fullcontext, fullkv, latentmas_sequential, merge,  # noqa: F401
               packllm, text)  # (registration)
from .base import PROTOCOLS, Outcome, Protocol, get_protocol

__all__ = ["PROTOCOLS", "Outcome", "Protocol", "get_protocol"]
