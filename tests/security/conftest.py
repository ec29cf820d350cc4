"""The security tests run real sandboxes with the runtime tests' fixtures, and real
``sandlot serve`` processes with the compat suite's."""

from tests.compat.conftest import compat_image_root  # noqa: F401
from tests.runtime.conftest import (  # noqa: F401
    oci_runtime,
    rt_image,
    runtime_data_dir,
    scratch_image,
)
