"""Protocols: one file each, registered by name in `PROTOCOLS`."""
from . import (alone, cacheback, cacheback_chain, cacheback_x, fullcontext, fullkv, latentmas_sequential,  # noqa: F401
               merge, packllm, retrieval, text)  # (registration)
from .base import PROTOCOLS, Outcome, Protocol, get_protocol

__all__ = ["PROTOCOLS", "Outcome", "Protocol", "get_protocol"]
