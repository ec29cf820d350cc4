"""The security tests run real sandboxes with the runtime tests' fixtures, and real
``sandlot serve`` processes with the compat suite's."""

import pytest

from sandlot.images.model import Image
from tests.compat.conftest import compat_image_root  # noqa: F401
from tests.runtime.conftest import (  # noqa: F401
    oci_runtime,
    rt_image,
    runtime_data_dir,
    scratch_image,
)
from tests.server.conftest import client, harness  # noqa: F401, E402


@pytest.fixture
def harness_runtime() -> tuple[str, Image | None]:
    """The API-bound tests check the server's own rules: the fake runtime is enough."""
    return "fake", None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules marked ``backends(...)`` run once per backend, as in tests/compat."""
    from tests.compat.conftest import pytest_generate_tests as per_backend

    per_backend(metafunc)
