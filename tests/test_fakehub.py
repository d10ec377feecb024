"""The local Hub of the tests (tests/fakehub.py) counts what it served before the client can act on it: a test that
reads `hub.served` as soon as its download returns sees every byte it was sent, however late the server's thread
runs after sending (the flake of test_range_reads: the last range read counted after the client had moved on)."""

from __future__ import annotations

import socketserver
import time
import urllib.request

from fakehub import FakeHub

REPO = "me/tiny"


class SlowAfterWrite:
    """A handler's output whose every write returns late, after the bytes have gone to the client: the server's
    thread held up exactly where a loaded machine may hold it."""

    def __init__(self, wfile):
        self.wfile = wfile

    def write(self, data):
        written = self.wfile.write(data)
        self.wfile.flush()
        time.sleep(0.3)
        return written

    def __getattr__(self, name):
        return getattr(self.wfile, name)


def test_served_bytes_are_counted_when_the_client_has_them(monkeypatch):
    setup = socketserver.StreamRequestHandler.setup

    def slow_setup(handler):
        setup(handler)
        handler.wfile = SlowAfterWrite(handler.wfile)

    monkeypatch.setattr(socketserver.StreamRequestHandler, "setup", slow_setup)
    data = bytes(range(256)) * 32
    hub = FakeHub({REPO: {"main": {"model.safetensors": data}}})
    with hub.serving():
        url = f"{hub.url}/{REPO}/resolve/main/model.safetensors"
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=8-4103"})) as response:
            got = response.read()
        seen = list(hub.served)
    assert got == data[8:4104]
    assert seen == [(f"/{REPO}/resolve/main/model.safetensors", 4096)]
