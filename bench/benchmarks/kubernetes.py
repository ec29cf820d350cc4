"""Issue 17, Kubernetes backend: create-to-Running and ``commands.run("true")`` on a second
``sandlot serve`` with ``[runtime] type = "kubernetes"``, beside raw ``kubectl run`` (until
Ready) + ``kubectl exec true`` and ``kubectl exec true`` on the same cluster and image.

The cluster is a kit cluster (``bench/k8s_kit.py``): the one ``SANDLOT_BENCH_K8S_DIR`` names,
or, in a full run as root, one started from the kit beside the checkout and removed after.
The bench loads the ``base`` image (as ``base:latest``) and the execd bundle image into its
node with the kit's ``ctr``, and works in a namespace of its own, deleted afterwards. With
no cluster (``--quick`` without that variable, no kit) the rows are reported as skipped,
with the reason.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.env import BenchEnv
from bench.k8s_kit import KitCluster, NoCluster
from bench.results import Measured, Row, ms, skipped
from bench.sdk import Sandboxes
from bench.server import SandlotServer

BENCH = "kubernetes"
KEYS = ("k8s.create", "k8s.create_node_cache", "k8s.create_warm", "k8s.true_rtt")
IMAGE = "base"
CREATE_TIMEOUT = 180.0
MAX_CREATES = 10
BUNDLE_CACHE = Path("/var/tmp/sandlot-test/execd-bundle")
ARCHIVES = Path("/var/tmp/sandlot-test/k8s-images")
LABELS = {"k8s.create": "kubernetes backend: create-to-Running (serial)",
          "k8s.create_node_cache": "kubernetes backend: create-to-Running, execd node cache "
                                   "(serial)",
          "k8s.create_warm": "kubernetes backend: create-to-Running, warm Pods (serial)",
          "k8s.true_rtt": 'kubernetes backend: commands.run("true") round trip'}


def _skipped(why: str) -> list[Row]:
    return [skipped(key, BENCH, label, "ms", why) for key, label in LABELS.items()]


class Kubectl:
    def __init__(self, kit_dir: Path, namespace: str) -> None:
        self.kit_dir = kit_dir
        self.kubeconfig = kit_dir / "kubeconfig"
        self.namespace = namespace

    def __call__(self, *args: str, check: bool = True) -> float:
        t0 = time.perf_counter()
        subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), "-n", self.namespace,
                        *args], check=check, capture_output=True, timeout=300)
        return time.perf_counter() - t0

    def load_images(self, image_cache: Path) -> None:
        """``base`` and the execd bundle image into the node (archives kept by content)."""
        from sandlot.images.store import ImageStore
        from sandlot.runtime.execd_bundle import ensure_bundle
        from sandlot.runtime.kubernetes import bundle_image
        from sandlot.runtime.kubernetes.archive import write_docker_archive

        image = ImageStore(image_cache / "images").get(IMAGE)
        if image is None:
            raise RuntimeError("the bench image cache has no base image")
        base = ARCHIVES / f"bench-base-{image.id.split(':')[-1][:24]}.tar"
        if not base.exists():
            write_docker_archive(base, f"{IMAGE}:latest", Path(image.lower_dirs[0]),
                                 env=list(image.config.env),
                                 working_dir=image.config.working_dir)
        bundle = ensure_bundle(BUNDLE_CACHE)
        archive = ARCHIVES / f"bundle-{bundle.path.name}.tar"
        if not archive.exists():
            bundle_image.write_image(bundle, archive, bundle_image.image_name(bundle))
        for path in (base, archive):
            subprocess.run([str(self.kit_dir / "ctr"), "images", "import", str(path)],
                           check=True, capture_output=True, timeout=900)


def _raw(kubectl: Kubectl, runs: int, creates: int) -> tuple[list[float], list[float]]:
    """kubectl run (until Ready) + the first exec; then exec round trips in one Pod."""
    create: list[float] = []
    for i in range(creates):
        name = f"raw-{i}"
        t = kubectl("run", name, f"--image={IMAGE}:latest", "--restart=Never",
                    "--image-pull-policy=Never", "--command", "--", "sleep", "infinity")
        t += kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=180s")
        t += kubectl("exec", name, "--", "true")
        create.append(t)
        kubectl("delete", "pod", name, "--grace-period=1", "--wait=false")
    kubectl("run", "raw-rtt", f"--image={IMAGE}:latest", "--restart=Never",
            "--image-pull-policy=Never", "--command", "--", "sleep", "infinity")
    kubectl("wait", "--for=condition=Ready", "pod/raw-rtt", "--timeout=180s")
    rtt = [kubectl("exec", "raw-rtt", "--", "true") for _ in range(runs)]
    kubectl("delete", "pod", "raw-rtt", "--grace-period=1", "--wait=false")
    return create, rtt


async def _creates(env: BenchEnv, boxes: Sandboxes, creates: int) -> list[float]:
    """Serial creates after an untimed first one (which, with the node cache, fills it)."""
    warm, _ = await asyncio.wait_for(boxes.create(IMAGE, ready_timeout=CREATE_TIMEOUT),
                                     CREATE_TIMEOUT)
    await boxes.delete(warm)
    created: list[float] = []
    for _ in range(creates):
        await env.quiesce(timeout=5.0)
        sandbox, elapsed = await asyncio.wait_for(
            boxes.create(IMAGE, ready_timeout=CREATE_TIMEOUT), CREATE_TIMEOUT)
        created.append(elapsed)
        await boxes.delete(sandbox)
    return created


async def _measure(env: BenchEnv, boxes: Sandboxes, creates: int
                   ) -> tuple[list[float], list[float]]:
    created = await _creates(env, boxes, creates)
    sandbox, _ = await asyncio.wait_for(boxes.create(IMAGE, ready_timeout=CREATE_TIMEOUT),
                                        CREATE_TIMEOUT)
    rtt: list[float] = []
    try:
        for _ in range(5):
            await sandbox.commands.run("true")
        await env.quiesce()
        for _ in range(env.scale.command_runs):
            t0 = time.perf_counter()
            execution = await sandbox.commands.run("true")
            rtt.append(time.perf_counter() - t0)
            if execution.error is not None:
                raise RuntimeError(f"`true` failed in the sandbox: {execution.error}")
    finally:
        await boxes.delete(sandbox)
    return created, rtt


def _warm_ready(kubectl: Kubectl) -> bool:
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubectl.kubeconfig), "-n", kubectl.namespace, "get",
         "pods", "-l", "sandlot.io/warm=true", "-o",
         "jsonpath={range .items[*]}{.status.phase}{' '}{end}"],
        capture_output=True, text=True, timeout=60, check=False).stdout.split()
    return "Running" in out


async def _measure_warm(env: BenchEnv, boxes: Sandboxes, kubectl: Kubectl,
                        creates: int) -> list[float]:
    """Serial creates of the default shape, each once the warm pool has a ready Pod (the
    refill after a claim is what a steady create rate sees)."""
    created: list[float] = []
    for _ in range(creates):
        deadline = time.monotonic() + CREATE_TIMEOUT
        while not await asyncio.to_thread(_warm_ready, kubectl):
            if time.monotonic() > deadline:
                raise RuntimeError("no warm Pod became ready")
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # execd's /ping after Running: the keeper marks it ready
        await env.quiesce(timeout=5.0)
        sandbox, elapsed = await asyncio.wait_for(
            boxes.create(IMAGE, ready_timeout=CREATE_TIMEOUT), CREATE_TIMEOUT)
        created.append(elapsed)
        await boxes.delete(sandbox)
    return created


def _server(env: BenchEnv, kubectl: Kubectl, warm: int,
            node_cache: Path | None = None) -> SandlotServer:
    delivery = (f'execd_delivery = "node-cache"\nnode_cache_dir = "{node_cache}"\n'
                if node_cache is not None else "")
    return SandlotServer(
        image_cache=env.server.image_cache, warm_pool_size=0, runtime_type="kubernetes",
        extra_config=(f'\n[kubernetes]\nkubeconfig_path = "{kubectl.kubeconfig}"\n'
                      f'namespace = "{kubectl.namespace}"\nrequest_fraction = 0.05\n'
                      f"warm_pool_size = {warm}\n{delivery}"),
    )


async def run(env: BenchEnv) -> list[Row]:
    kit = KitCluster(start=not env.quick)
    try:
        kit_dir = await asyncio.to_thread(kit.open)
    except NoCluster as exc:
        return _skipped(str(exc))
    try:
        return await _run(env, kit_dir)
    finally:
        await asyncio.to_thread(kit.close)


async def _run(env: BenchEnv, kit_dir: Path) -> list[Row]:
    namespace = "sandlot-bench-" + secrets.token_hex(4)
    kubectl = Kubectl(Path(kit_dir), namespace)
    subprocess.run(["kubectl", "--kubeconfig", str(kubectl.kubeconfig), "create", "namespace",
                    namespace], check=True, capture_output=True)
    creates = min(env.scale.create_serial, MAX_CREATES)
    node_cache = Path(tempfile.mkdtemp(prefix="sandlot-bench-execd-cache-"))
    server = _server(env, kubectl, 0)
    boxes = Sandboxes(server, env.sandboxes.run_id)
    try:
        await asyncio.to_thread(kubectl.load_images, env.server.image_cache)
        try:
            await asyncio.to_thread(server.start)
            created, rtt = await _measure(env, boxes, creates)
        finally:
            await boxes.shut_down()
        # The same with [kubernetes] execd_delivery = "node-cache" (the node is the host).
        server = _server(env, kubectl, 0, node_cache)
        boxes = Sandboxes(server, env.sandboxes.run_id)
        try:
            await asyncio.to_thread(server.start)
            cached = await _creates(env, boxes, creates)
        finally:
            await boxes.shut_down()
        # The same with one warm Pod of ``base`` kept ([kubernetes] warm_pool_size).
        server = _server(env, kubectl, 1)
        boxes = Sandboxes(server, env.sandboxes.run_id)
        try:
            await asyncio.to_thread(server.start)
            warm = await _measure_warm(env, boxes, kubectl, creates)
        finally:
            await boxes.shut_down()
        base_create, base_rtt = await asyncio.to_thread(
            _raw, kubectl, env.scale.command_runs, creates)
    finally:
        subprocess.run(["kubectl", "--kubeconfig", str(kubectl.kubeconfig), "delete",
                        "namespace", namespace, "--wait=false"], capture_output=True, check=False)
        subprocess.run(["chmod", "-R", "u+w", str(node_cache)], check=False)
        shutil.rmtree(node_cache, ignore_errors=True)
    return [
        Row(key="k8s.create", bench=BENCH, label=LABELS["k8s.create"], unit="ms",
            sandlot=Measured("sandlot[kubernetes]", ms(created)),
            baselines=[Measured("kubectl run+wait+exec", ms(base_create))],
            note="no warm pool; Pod IP connect; kit cluster (v1.20, containerd)"),
        Row(key="k8s.create_node_cache", bench=BENCH, label=LABELS["k8s.create_node_cache"],
            unit="ms", sandlot=Measured("sandlot[kubernetes]", ms(cached)),
            baselines=[Measured("kubectl run+wait+exec", ms(base_create))],
            note='execd_delivery = "node-cache", entry filled by the first (untimed) create; '
                 "no warm pool"),
        Row(key="k8s.create_warm", bench=BENCH, label=LABELS["k8s.create_warm"], unit="ms",
            sandlot=Measured("sandlot[kubernetes]", ms(warm)),
            baselines=[Measured("kubectl run+wait+exec", ms(base_create))],
            note="[kubernetes] warm_pool_size = 1, each create once a warm Pod is ready"),
        Row(key="k8s.true_rtt", bench=BENCH, label=LABELS["k8s.true_rtt"], unit="ms",
            sandlot=Measured("sandlot[kubernetes]", ms(rtt)),
            baselines=[Measured("kubectl exec", ms(base_rtt))]),
    ]
