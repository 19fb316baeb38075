#!/usr/bin/env bash
# Copies the CUDA binaries of a build folder (osprey, the GPU-labelled test executables and every
# CUDA bench_* executable) into one
# flat folder, to carry to a GPU machine that cannot build them itself (no GTest there) and run with
# `scripts/gpu_suite.sh --bin DIR`. Strips debug sections so the folder stays small.
#   scripts/stage_gpu_bin.sh [BUILD (default build)] [DEST (default .device/cuda/bin)]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build}"
dest="${2:-$here/.device/cuda/bin}"
[[ -x "$build/osprey" ]] || { echo "stage_gpu_bin: no $build/osprey (build first)" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
cp "$build/osprey" "$dest/"
# The executables of the tests labelled gpu, as ctest knows them.
ctest --test-dir "$build" -L gpu -N -V 2>/dev/null | sed -n 's/.*Test command: \([^ ]*\).*/\1/p' | sort -u |
    while read -r exe; do cp "$exe" "$dest/"; done
find "$build/bench" -maxdepth 1 -type f -perm -u+x -name 'bench_*' ! -name 'bench_tokenizer' -exec cp {} "$dest/" \;
strip --strip-debug "$dest"/* 2>/dev/null || true
# bench_forward --trace needs CUPTI; the GPU machine may not have this toolkit's copy on its library path
# (gpu_suite.sh --bin adds DIR to LD_LIBRARY_PATH).
if [[ -x "$dest/bench_forward" ]]; then
    cupti="$(ldd "$dest/bench_forward" | awk '/libcupti/ {print $3}')"
    [[ -n "$cupti" && -f "$cupti" ]] && cp -L "$cupti" "$dest/"
fi
# NCCL (libnccl.so.2, linked by its soname): the H200 has it installed system-wide, where the loader finds
# it, so it is not copied by default (218 MB). OSPREY_STAGE_NCCL=1 copies the build's own copy, for a
# machine without one (gpu_suite.sh --bin and LD_LIBRARY_PATH=DIR then pick it up before the system's).
nccl="$(ldd "$dest/osprey" | awk '/libnccl/ {print $3}')"
if [[ "${OSPREY_STAGE_NCCL:-0}" == 1 && -n "$nccl" && -f "$nccl" ]]; then
    cp -L "$nccl" "$dest/libnccl.so.2"
elif [[ -n "$nccl" ]]; then
    echo "stage_gpu_bin: NCCL not copied (the GPU machine's libnccl.so.2 is used; OSPREY_STAGE_NCCL=1 copies $nccl)"
fi
du -sh "$dest"
