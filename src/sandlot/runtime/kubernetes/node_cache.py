"""Which nodes hold a verified execd cache entry (``[kubernetes] execd_delivery =
"node-cache"``), so that a Pod can start without any init container.

An init container costs far more than its own work: the kubelet notices that it ended on
its next relist (about a second) before it starts the sandbox container. So a Pod skips it
once every node it may land on is known to hold the entry: learned from this server's own
Pods whose fill init container (``bundle_fill``) succeeded there, and the Pod is then bound
to those nodes. Until then (a new node, a restarted server with no such Pod left, a cluster
that does not let sandlot list nodes) Pods keep the init container, which only verifies an
entry that is there. A Pod bound to a node whose entry went missing fails to start; that
node is forgotten and the next Pod there fills it again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sandlot.runtime.kubernetes.apierror import explain
from sandlot.runtime.kubernetes.pod import BUNDLE_VOLUME, INIT_FILL, PodPlan

log = logging.getLogger(__name__)
NODES_TTL = 30.0  # seconds a listing of the cluster's nodes is reused
_UNSCHEDULABLE = ("NoSchedule", "NoExecute")


class NodeCache:
    """The nodes known to hold this server's bundle entry (see module docstring)."""

    def __init__(self, core: client.CoreV1Api, plan: PodPlan) -> None:
        self.core = core
        self.plan = plan
        self.nodes: set[str] = set()
        self._eligible: frozenset[str] | None = None
        self._listed_at = float("-inf")
        self._cannot_list = False

    def note(self, pod: Any) -> None:
        """Learn from a Pod whose fill init container of this bundle exited 0."""
        node = pod.spec.node_name if pod.spec is not None else None
        if not node or not self._uses_entry(pod):
            return
        for status in pod.status.init_container_statuses or []:
            done = status.state.terminated if status.state is not None else None
            if status.name == INIT_FILL and done is not None and done.exit_code == 0:
                self.nodes.add(node)

    def forget(self, pod: Any) -> None:
        """A Pod bound to cached nodes did not start: its node's entry is not trusted."""
        node = pod.spec.node_name if pod is not None and pod.spec is not None else None
        if node:
            self.nodes.discard(node)
        else:
            self.nodes.clear()

    def _uses_entry(self, pod: Any) -> bool:
        entry = self.plan.cache_entry()
        return any(v.name == BUNDLE_VOLUME and v.host_path is not None
                   and v.host_path.path == entry for v in pod.spec.volumes or [])

    async def bound_nodes(self) -> tuple[str, ...] | None:
        """The nodes to bind a new Pod to (it then has no init container), or None when
        some node it could land on is not known to hold the entry."""
        if not self.nodes:
            return None
        eligible = await self._eligible_nodes()
        if not eligible or not eligible <= self.nodes:
            return None
        return tuple(sorted(self.nodes))

    async def _eligible_nodes(self) -> frozenset[str] | None:
        """Ready, schedulable nodes matching ``node_selector`` (untolerated taints aside)."""
        if self._cannot_list:
            return None
        if time.monotonic() - self._listed_at < NODES_TTL:
            return self._eligible
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.plan.cfg.node_selector.items()))
        try:
            listed = await self.core.list_node(label_selector=selector)
        except ApiException as exc:
            if exc.status in (401, 403):
                self._cannot_list = True
                log.warning("execd node cache: cannot list nodes (%s); every Pod keeps the "
                            "init container that verifies the cache", explain(exc))
                return None
            raise
        tolerates = bool(self.plan.cfg.tolerations)
        self._eligible = frozenset(
            node.metadata.name for node in listed.items
            if not node.spec.unschedulable and _ready(node)
            and (tolerates or not any(t.effect in _UNSCHEDULABLE
                                      for t in node.spec.taints or [])))
        self._listed_at = time.monotonic()
        return self._eligible


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in node.status.conditions or [])
