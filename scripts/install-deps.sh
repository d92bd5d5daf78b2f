#!/usr/bin/env bash
# Installs the Debian packages multigrad needs, only those that are missing;
# does nothing (and needs no network) when all are there.
#   scripts/install-deps.sh          build, test and run needs
#   scripts/install-deps.sh --bench  also the peers the benchmarks compare
#                                    against (PyTorch from python3-torch)
set -euo pipefail

pkgs=(build-essential pkg-config libopenblas-dev zlib1g-dev libssl-dev
      libopenmpi-dev openmpi-bin dataset-fashion-mnist fortunes
      clang libclang-rt-14-dev)
if [ "${1:-}" = "--bench" ]; then
    pkgs+=(python3-torch python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
        echo "install-deps: missing packages (${missing[*]}) and not root; install them as root" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
