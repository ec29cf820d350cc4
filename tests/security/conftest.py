"""The security tests run real sandboxes with the runtime tests' fixtures."""

from tests.runtime.conftest import (  # noqa: F401
    oci_runtime,
    rt_image,
    runtime_data_dir,
    scratch_image,
)
