"""The kubernetes backend must import without the OCI backend: the server image it runs in
(scripts/build-server-image.py) ships no libnftables, which importing the OCI package loads
(``net/firewall.py``), so such an import fails the server's start in the cluster."""

from __future__ import annotations

import subprocess
import sys


def test_the_kubernetes_backend_imports_nothing_of_the_oci_backend() -> None:
    code = ("import sys, sandlot.runtime.kubernetes\n"
            "print(sorted(m for m in sys.modules if m.startswith('sandlot.runtime.oci')"
            " or m in ('nftables', 'sandlot.net.firewall')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"
