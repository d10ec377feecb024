"""A client's request as it arrives, read a piece at a time as the connection has it, so that a worker waiting for
one client's request still serves every other (anisweep.worker.server). The request: a 4-byte length, with the
client's three standard streams attached, then that many bytes of a marshalled dict (anisweep.worker.client)."""

from __future__ import annotations

import marshal
import os
import socket
import struct

STREAMS = 3
LARGEST = 64 << 20  # bytes: a request's environment and arguments come to kilobytes


class Broken(ValueError):
    """A request that is not one: the worker closes its connection without a job."""


class Request:
    def __init__(self, connection: socket.socket, deadline: float):
        connection.setblocking(False)
        self.connection, self.deadline = connection, deadline
        self.header, self.payload, self.fds = b"", bytearray(), []
        self.size: int | None = None

    def fileno(self) -> int:
        return self.connection.fileno()

    def read(self) -> dict | None:
        """Read what has come: the request once it is whole (then its `fds` are the caller's to close), else None.
        Raises Broken, or OSError where the connection fails."""
        try:
            while self.size is None:
                data, fds, _, _ = socket.recv_fds(self.connection, 4 - len(self.header), STREAMS)
                self.fds += fds
                if not data:
                    raise Broken("the request ended early")
                self.header += data
                if len(self.header) == 4:
                    (self.size,) = struct.unpack("!I", self.header)
                    if len(self.fds) != STREAMS:
                        raise Broken(f"expected {STREAMS} file descriptors, got {len(self.fds)}")
                    if self.size > LARGEST:
                        raise Broken(f"a request of {self.size} bytes")
            while len(self.payload) < self.size:
                data = self.connection.recv(min(1 << 16, self.size - len(self.payload)))
                if not data:
                    raise Broken("the request ended early")
                self.payload += data
        except BlockingIOError:
            return None
        try:
            request = marshal.loads(self.payload)  # from a process of this user's (SO_PEERCRED), the same interpreter
        except (ValueError, EOFError, TypeError) as error:  # marshal's errors for bytes that are not its own
            raise Broken(f"the request is not marshalled: {error}") from None
        if not isinstance(request, dict):
            raise Broken(f"the request is a {type(request).__name__}, not a dict")
        return request

    def close(self) -> None:
        """Drop the request: its connection and the streams that came with it."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.connection.close()
