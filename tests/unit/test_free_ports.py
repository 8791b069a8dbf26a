"""The ports a local Ray head is started with are distinct, whatever port the kernel hands out next."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from icebatch.tools.local_backend import free_ports

pytestmark = pytest.mark.unit


class LowestFreePort:
    """A kernel that answers a bind to port 0 with the lowest port not bound now (Linux may hand a port just let
    go out again: CI saw a head's dashboard agent and metrics exporter both given 35329)."""

    bound: set[int] = set()

    def __init__(self, *_args: Any) -> None:
        self.port = 0

    def bind(self, address: tuple[str, int]) -> None:
        self.port = min(set(range(40000, 40100)) - LowestFreePort.bound)
        LowestFreePort.bound.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        LowestFreePort.bound.discard(self.port)

    def __enter__(self) -> LowestFreePort:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def test_a_heads_ports_are_distinct_even_when_the_kernel_reuses_a_port_just_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a kernel that hands out the lowest free port
    monkeypatch.setattr(LowestFreePort, "bound", set())
    monkeypatch.setattr(socket, "socket", LowestFreePort)
    # when the seven ports of a head are picked
    ports = free_ports(7)
    # then they are seven distinct ports, and none is held once picked
    assert len(set(ports)) == 7, ports
    assert LowestFreePort.bound == set()
