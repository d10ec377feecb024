"""The byte ranges a Hub checkpoint's range reads have moved, held on local disk for the rest of the job.

Two measures of one job read the same tensors (the built-in `circuits` and `weight_matrices` both read every
layer's W_Q, W_K and W_V): a range asked for again is read back from a spool file, not requested again, so that each
range moves once per checkpoint. The spool is an anonymous temporary file (in TMPDIR, removed when the source is
gone or the process ends): the bytes held cost disk, not memory. A range is found again by its file, first and
last byte exactly: the reads of a layout ask for the same spans each time.
"""

from __future__ import annotations

import tempfile
from typing import IO


class HeldRanges:
    """Bytes [start, stop) of the named files, written once to a spool and read back on demand."""

    def __init__(self):
        self._spool: IO[bytes] | None = None
        self._at: dict[tuple[str, int, int], int] = {}  # (file, start, stop) -> offset in the spool

    def __contains__(self, key: tuple[str, int, int]) -> bool:
        return key in self._at

    def keep(self, name: str, start: int, stop: int, data: bytes) -> None:
        if (name, start, stop) in self._at:
            return
        if self._spool is None:
            self._spool = tempfile.TemporaryFile(prefix="anisweep-ranges-")
        self._spool.seek(0, 2)
        self._at[(name, start, stop)] = self._spool.tell()
        self._spool.write(data)

    def read(self, name: str, start: int, stop: int) -> bytes:
        """The bytes kept for exactly this range (a KeyError where none were)."""
        offset = self._at[(name, start, stop)]
        self._spool.seek(offset)
        return self._spool.read(stop - start)
