"""The Jupyter Server REST and WebSocket API, served by execd's code service on ``$JUPYTER_PORT``.

Jupyter clients (nbclient through a gateway kernel manager, Jupyter Server's ``--GatewayClient``,
JupyterLab, VS Code) start and drive kernels here as they would on a Jupyter (Kernel Gateway)
server; the kernels are the code service's own (same kernelspecs, same warm pool, Java and Go
contexts included). See docs/code-interpreter.md.
"""

from .server import JupyterApiServer, serve_jupyter_api

__all__ = ["JupyterApiServer", "serve_jupyter_api"]
