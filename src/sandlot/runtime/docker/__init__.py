"""The Docker backend: sandboxes as containers of a Docker engine, driven with docker-py."""

from sandlot.runtime.docker.runtime import DockerRuntime

__all__ = ["DockerRuntime"]
