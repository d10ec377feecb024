"""The errors a user can act on: each names what is wrong and what to do."""

from __future__ import annotations

import errno

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full disk and of a quota reached


class ConfigError(ValueError):
    """A model entry names something that does not exist; the message names the nearest valid ones."""
