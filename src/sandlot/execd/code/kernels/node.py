"""sandlot's native JavaScript/TypeScript context: a Node.js process running :mod:`.noderunner`.

Why not a Jupyter JS kernel: the npm ones (ijavascript, tslab) need native ZeroMQ bindings built
or downloaded at install time; a plain ``node`` with a small runner needs nothing but Node itself.
"""

from __future__ import annotations

import json

from .noderunner import RUNNER
from .pipe import PipeKernel


class NodeKernel(PipeKernel):
    """A persistent Node.js global scope; ``typescript`` runs cells through tsc's transpiler."""

    def __init__(self, node: str, language: str, *, cwd: str | None, env: dict[str, str]):
        super().__init__([node, "-e", RUNNER], language, cwd=cwd, env=env)

    def encode_request(self, run_id: str, code: str) -> bytes:
        request = {"id": run_id, "code": code, "ts": self.language == "typescript"}
        return json.dumps(request).encode()
