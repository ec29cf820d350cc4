#!/usr/bin/env bash
# Installs what sandlot needs on a Debian/Ubuntu host (as root) and the Python venv.
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
APT_PACKAGES=(runc runsc skopeo umoci debootstrap docker-registry nftables iproute2 procps psmisc
              ca-certificates util-linux mount e2fsprogs tmux zstd postgresql
              openjdk-17-jdk-headless golang-go
              chromium
              catatonit libcap-dev libseccomp2)
# catatonit: PID 1 of a sandbox whose execd the zygote starts; libcap-dev: python-prctl builds
# against it; libseccomp2: pyseccomp loads it (both for the zygote, docs/runtime.md).
# chromium: the web console's tests drive it headless through Playwright (whose own browser
# download is not used).
# docker.io: the docker runtime's tests and the bench start a private dockerd of their own.
# SANDLOT_WITH_DOCKER=0 leaves it out.
if [ "${SANDLOT_WITH_DOCKER:-1}" = 1 ]; then APT_PACKAGES+=(docker.io); fi

# runsc: on Debian bookworm the gVisor of bookworm-backports (2024) replaces bookworm's own (2022),
# whose checkpoint always compresses (hibernating 256 MiB takes seconds; docs/runtime.md). Other
# distributions keep their own runsc from the list above.
RUNSC_BACKPORTS_MIN=0.0~20240729
on_bookworm=$( (. /etc/os-release 2>/dev/null
                 [ "${ID:-}" = debian ] && [ "${VERSION_CODENAME:-}" = bookworm ]) && echo 1 || echo 0)
if [ "$on_bookworm" = 1 ]; then
  APT_PACKAGES=("${APT_PACKAGES[@]/#%runsc/}")  # installed below, from bookworm-backports
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "need root to apt-get install: ${missing[*]}" >&2; exit 1; fi
  echo "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  # No package's service is started by the install (e.g. docker.io's system dockerd would
  # create docker0 on a private range): tests start the daemons they need themselves.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
  fi
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || { [ $own_policy = 1 ] && rm -f "$policy"; exit 1; }
  if [ $own_policy = 1 ]; then rm -f "$policy"; fi
fi

runsc_version=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
if [ $on_bookworm = 1 ] && ! dpkg --compare-versions "${runsc_version:-0}" ge "$RUNSC_BACKPORTS_MIN"
then
  if [ "$(id -u)" != 0 ]; then echo "need root to install runsc from bookworm-backports" >&2; exit 1; fi
  echo "apt-get install -t bookworm-backports runsc (installed: ${runsc_version:-none})"
  export DEBIAN_FRONTEND=noninteractive
  if ! grep -rqs --include='*.list' --include='*.sources' --include=sources.list \
       -E '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    cat > /etc/apt/sources.list.d/bookworm-backports.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  fi
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    -t bookworm-backports runsc >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.sandlot-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e '.[test]'
  touch "$stamp"
fi

# Kernels the code-interpreter tests drive on the host: bash_kernel's kernelspec in the venv,
# and TypeScript for sandlot's native JS/TS contexts (Node.js itself comes with the machine or apt).
if [ ! -f "$VENV/share/jupyter/kernels/bash/kernel.json" ]; then
  "$VENV/bin/python" -m bash_kernel.install --sys-prefix >/dev/null
fi
if ! command -v node >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if ! node -e "require.resolve('typescript')" 2>/dev/null \
   && [ ! -d "$(npm root -g 2>/dev/null)/typescript" ]; then
  npm install -g --no-fund --no-audit typescript@5 >/dev/null
fi
