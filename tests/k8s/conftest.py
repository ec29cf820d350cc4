"""The kubernetes runtime's tests: a real ``sandlot serve`` on the session's cluster
(``k8s_cluster`` in tests/conftest.py), driven by the released OpenSandbox clients.

The compat suite's server fixtures are reused with ``backend = "kubernetes"``; every module
here runs against the one cluster of the session, each server in the session's namespace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.compat.conftest import (  # noqa: F401 - fixtures and the backends hook
    compat_backend,
    compat_image_root,
    fresh_server,
    pytest_generate_tests,
    sandlot_server,
)
from tests.k8s_cluster import Cluster

pytestmark = pytest.mark.backends("kubernetes")


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_cluster(k8s_cluster: Cluster) -> Iterator[None]:
    """After the suite (every server destroyed), no sandlot Pod, Secret or PVC remains."""
    yield
    deadline = time.monotonic() + 90
    left = k8s_cluster.sandlot_objects()
    while left and time.monotonic() < deadline:  # the kubelet stops deleted Pods
        time.sleep(1)
        left = k8s_cluster.sandlot_objects()
    assert left == {}, f"sandlot left {left} in namespace {k8s_cluster.namespace}"
