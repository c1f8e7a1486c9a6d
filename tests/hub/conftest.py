"""The Hub: crawl, configs, the bundled snapshot. The shared fixtures this part's tests use, from
tests/support."""

from __future__ import annotations

from support.hub import fake_hub, hub_api, online
from support.timing import sleeps

__all__ = ["fake_hub", "hub_api", "online", "sleeps"]
