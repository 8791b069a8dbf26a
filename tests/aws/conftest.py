"""The aws tier's fixtures: a recording moto server and a deployed world per test module (tests/aws/world.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.aws.world import World, make_world
from tests.support.aws import enforced_iam, moto_server
from tests.support.iam_audit import Recorder


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[str, Recorder]]:
    """A moto server of this module's own that records who called what (for the IAM audit), with IAM enforced: each
    part calls it with a session of its role as deployed (tests/aws/deploy.py), the tests as an administrator."""
    recorders: list[Recorder] = []

    def wrap(app: Any) -> Recorder:
        recorders.append(Recorder(app))
        return recorders[-1]

    with moto_server(recorder=wrap) as endpoint, enforced_iam(endpoint):
        yield endpoint, recorders[0]


@pytest.fixture(scope="module")
def world(
    request: pytest.FixtureRequest,
    recorded: tuple[str, Recorder],
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """The module's world, deployed as the module's ``STACK`` (the stacks of two modules must not share a name:
    moto's state outlives a module's server)."""
    aws_endpoint, recorder = recorded
    stack = getattr(request.module, "STACK", None)
    assert stack, f"{request.module.__name__} names no STACK of its own"
    built = make_world(aws_endpoint, recorder, tiny_model, tmp_path_factory.mktemp("aws"), stack=stack)
    yield built
    built.k8s.stop()
