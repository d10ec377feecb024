"""The errors a user can act on: each names what is wrong and what to do."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model entry names something that does not exist; the message names the nearest valid ones."""
