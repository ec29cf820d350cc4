"""The kubernetes runtime's tests: a real ``sandlot serve`` on the session's cluster
(``k8s_cluster`` in tests/conftest.py), driven by the released OpenSandbox clients.

The compat suite's server fixtures are reused with ``backend = "kubernetes"``; every module
here runs against the one cluster of the session, each server in the session's namespace.
"""

from __future__ import annotations

import pytest

from tests.compat.conftest import (  # noqa: F401 - fixtures and the backends hook
    compat_backend,
    compat_image_root,
    fresh_server,
    pytest_generate_tests,
    sandlot_server,
)

pytestmark = pytest.mark.backends("kubernetes")
