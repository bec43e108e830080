#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what the build needs (Debian packages, when missing), builds gca in
# ./build and runs gca-demo on the default backend: the GPU when a CUDA driver
# and device are present, else the sim backend.
set -euo pipefail
cd "$(dirname "$0")"

need=()
for pkg in gcc meson ninja-build pkg-config libcmocka-dev libjansson-dev libjemalloc-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "demo: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
build/tools/gca-demo
echo
exec build/tools/gca-train --steps 6
