"""Kernel backends: Jupyter kernels through jupyter_client, and a native Node.js context."""
