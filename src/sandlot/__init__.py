"""sandlot: a self-hosted sandbox platform that speaks the OpenSandbox contracts."""

__version__ = "0.1.0"
