"""The Kubernetes backend: each sandbox is a Pod of an existing cluster (kubernetes_asyncio)."""

from sandlot.runtime.kubernetes.runtime import KubernetesRuntime

__all__ = ["KubernetesRuntime"]
