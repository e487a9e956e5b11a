#!/usr/bin/env bash
# Sets up a fresh Debian machine for Cuvil: system packages, then the package with every extra.
# torch is pinned to the CPU build by constraints.txt (an unpinned torch pulls a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross chromium)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  for attempt in 1 2 3; do
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null && break
    [ "$attempt" = 3 ] && { echo "apt-get install ${missing[*]} failed" >&2; exit 1; }
    sleep 5
  done
fi

python3 -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[all]'
