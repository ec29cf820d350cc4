"""The released ``opensandbox-code-interpreter`` SDK on a Pod of the ``code-interpreter``
image (loaded into the node from the local test store): the compat suite's acceptance run."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.images.model import Image
from tests.compat.conftest import SandlotServer
from tests.compat.test_code_interpreter import IMAGE, code_interpreter_image  # noqa: F401
from tests.compat.test_code_interpreter import test_code_interpreter_image as acceptance

pytestmark = [pytest.mark.timeout(1800), pytest.mark.backends("kubernetes")]


@pytest.fixture(scope="module")
def code_server(code_interpreter_image: Image,  # noqa: F811
                sandlot_server: SandlotServer) -> SandlotServer:
    sandlot_server.provide_image(code_interpreter_image, IMAGE)
    return sandlot_server


async def test_code_interpreter_on_a_pod(code_server: SandlotServer,
                                         record_property: Any) -> None:
    await acceptance(code_server, record_property)
