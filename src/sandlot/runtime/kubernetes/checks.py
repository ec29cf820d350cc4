"""What ``sandlot doctor`` checks of a cluster: the API server answers, and this sandlot's
account may do what the kubernetes runtime does (asked with SelfSubjectAccessReviews)."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sandlot.config import Config
from sandlot.errors import RuntimeFailure
from sandlot.runtime.kubernetes import netpolicy
from sandlot.runtime.kubernetes.apierror import explain
from sandlot.runtime.kubernetes.dnsfilter import listen_host_is_local
from sandlot.runtime.kubernetes.runtime import api_client

# (API group, resource, subresource, verbs) the runtime uses in its namespace.
NEEDED = [
    ("", "pods", "", ("create", "get", "list", "watch", "patch", "delete")),
    ("", "secrets", "", ("create", "patch", "deletecollection")),
    ("", "persistentvolumeclaims", "", ("get",)),
]
# ... and with egress policies in mode dns+nft (a NetworkPolicy per sandbox).
NEEDED_FOR_NETWORK_POLICIES = [
    ("networking.k8s.io", "networkpolicies", "",
     ("create", "get", "list", "patch", "delete")),
]


@dataclass
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # False: a warning, doctor still passes


async def cluster_findings(cfg: Config) -> list[Finding]:
    kcfg = cfg.kubernetes
    try:
        api = await api_client(cfg)
    except RuntimeFailure as exc:
        return [Finding("Kubernetes API", False, str(exc),
                        "set [kubernetes] kubeconfig_path or KUBECONFIG, or run in a Pod")]
    try:
        try:
            version = await client.VersionApi(api).get_code()
        except (ApiException, OSError) as exc:
            detail = explain(exc) if isinstance(exc, ApiException) else str(exc)
            return [Finding("Kubernetes API", False, f"{api.configuration.host}: {detail}",
                            "check the kubeconfig's server address and credentials")]
        found = [Finding("Kubernetes API", True,
                         f"{api.configuration.host}: Kubernetes {version.git_version}")]
        needed = list(NEEDED)
        if kcfg.connect_mode == "port-forward":
            needed.append(("", "pods", "portforward", ("create", "get")))
        if netpolicy.writes_network_policies(cfg):
            needed += NEEDED_FOR_NETWORK_POLICIES
        missing = []
        auth = client.AuthorizationV1Api(api)
        for group, resource, sub, verbs in needed:
            for verb in verbs:
                review = {"apiVersion": "authorization.k8s.io/v1",
                          "kind": "SelfSubjectAccessReview",
                          "spec": {"resourceAttributes": {
                              "namespace": kcfg.namespace, "verb": verb, "group": group,
                              "resource": resource, "subresource": sub}}}
                body: object = review
                answer = await auth.create_self_subject_access_review(body)  # type: ignore[arg-type]
                if not answer.status.allowed:
                    missing.append(f"{verb} {resource}{'/' + sub if sub else ''}")
        found.append(Finding(
            f"permissions in namespace {kcfg.namespace}", not missing,
            "all the runtime needs" if not missing else "missing: " + ", ".join(missing),
            "" if not missing else "bind the Role of deploy/kubernetes/rbac.yaml"))
        if kcfg.execd_delivery == "node-cache":
            found.append(await _node_cache_finding(auth, kcfg.node_cache_dir))
        # What egress policies guarantee here (informational: every answer is a valid set-up).
        found.append(Finding("egress policies", True, netpolicy.guarantees(cfg)))
        if netpolicy.filter_configured(cfg):
            found.append(dns_listen_finding(cfg))
        runtime_class = cfg.secure_runtime.k8s_runtime_class
        if runtime_class:
            try:
                await client.NodeV1Api(api).read_runtime_class(runtime_class)
                found.append(Finding("RuntimeClass", True, runtime_class))
            except ApiException as exc:
                found.append(Finding("RuntimeClass", False, f"{runtime_class}: {explain(exc)}",
                                     "install the runtime (e.g. gVisor) and its RuntimeClass"))
        return found
    finally:
        await api.close()


async def _node_cache_finding(auth: client.AuthorizationV1Api, cache_dir: str) -> Finding:
    """execd_delivery = "node-cache": Pods mount a hostPath (refused by Pod Security
    "baseline"/"restricted" namespaces; the create then says so), and skip the init container
    only when sandlot may list the nodes (cluster-wide ``list nodes``)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": "list", "resource": "nodes"}}}
    body: object = review
    answer = await auth.create_self_subject_access_review(body)  # type: ignore[arg-type]
    if answer.status.allowed:
        return Finding("execd node cache", True,
                       f"hostPath {cache_dir} on each node; Pods on nodes holding the entry "
                       "start without an init container")
    return Finding("execd node cache", False,
                   f"hostPath {cache_dir}, but this account may not list nodes: every Pod "
                   "keeps the init container (it only verifies the entry)",
                   "grant list on nodes (a ClusterRole), or use execd_delivery = \"copy\"")


def dns_listen_finding(cfg: Config) -> Finding:
    """Whether the DNS filter's listen address is on this host now. Absent is a warning,
    not a failure: a node's Pod bridge gets its address with the node's first Pod, and the
    server listens on it anyway (``dnsfilter``)."""
    host, port = netpolicy.filter_listen(cfg)
    try:
        present = listen_host_is_local(host)
    except OSError as exc:
        return Finding("DNS filter address", False, f"{host}:{port}: {exc}",
                       "set [kubernetes] dns_filter_listen to an address of this host")
    if present:
        return Finding("DNS filter address", True, f"listens on {host}:{port}")
    return Finding(
        "DNS filter address", False,
        f"{host} is on no interface of this host now; the server listens on it anyway, and "
        "sandbox Pods' names resolve once it is there (a node's Pod bridge gets its address "
        "with its first Pod)",
        "if this is not the host's address on the Pod network, set [kubernetes] "
        "dns_filter_address (or dns_filter_listen) to one it has", required=False)
