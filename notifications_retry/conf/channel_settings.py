"""The part of a channel's configuration a provider receives, detached from the ORM.

Its own module so that the models and the providers can both name it without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ChannelSettings:
    """The part of a ``ChannelConfig`` a provider needs, detached from the ORM."""

    key: str
    provider_key: str
    timeout_seconds: float
    max_concurrency: int
    options: Mapping[str, Any]
