#!/usr/bin/env bash
# Puts the CUDA 13.0 headers that NVIDIA's cuda-async 0.5 crates need at
# build time (bindgen) into a folder, from pip wheels, on a machine without
# the CUDA toolkit; installs libclang if missing. Prints the folder: build
# with CUDA_TOOLKIT_PATH set to it. Seen working on these machines.
#
#   export CUDA_TOOLKIT_PATH=$(scripts/cuda-headers.sh)
set -euo pipefail
root=${1:-/tmp/cuda-headers-13.0}
if [ ! -f "$root/include/cuda.h" ]; then
  d=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 -d "$d" \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-curand==10.4.0.35 >&2
  mkdir -p "$root/include"
  for w in "$d"/*.whl; do
    (cd "$d" && rm -rf x && mkdir x && cd x && unzip -q "$w" &&
      find . -path '*/include/*' -type f | while read -r f; do
        rel=${f#*/include/}; mkdir -p "$root/include/$(dirname "$rel")"; cp "$f" "$root/include/$rel"; done)
  done
fi
dpkg -s libclang-dev >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libclang-dev; } >&2
echo "$root"
