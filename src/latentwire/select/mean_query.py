"""Mean query attention: CacheBack's Q_t without the concentration correction (p = 0)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import register
from .cacheback import CacheBackSelector
from ..errors import ConfigError


@register
@dataclass
class MeanQuerySelector(CacheBackSelector):
    name = "mean_query"
    p: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.p != 0:
            raise ConfigError("mean_query is p = 0; use the cacheback selector for p > 0")
