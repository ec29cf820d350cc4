"""The default, daemon-less runtime: OCI containers through runc (or crun/runsc)."""

from sandlot.runtime.oci.runtime import OciRuntime

__all__ = ["OciRuntime"]
