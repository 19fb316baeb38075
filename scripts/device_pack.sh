#!/usr/bin/env bash
# Packs what one call on a lent GPU needs into .device/bin.tar.xz, to carry beside scripts/device_call.sh:
# every GPU test binary of BUILD (ctest label gpu), osprey, bench_forward, bench_moe_decode, libcupti (for
# bench_forward --trace), and with --timeline bench_forward of a -DOSPREY_TIMELINE=ON build (BUILD-tl,
# configured and built here when missing) as bench_forward_tl. Binaries lose their debug sections (the
# carry limit is 64 MiB); the script fails if the archive is larger.
#
#   scripts/device_pack.sh [--build DIR] [--timeline] [--extra PATH ...]
#
# Then, from the repository root, on the device (the run tool):
#   bash scripts/device_call.sh STAGE...        (carry [".device/bin.tar.xz"])
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
timeline=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --timeline) timeline=1; shift ;;
    --extra) extra+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--timeline] [--extra PATH ...]" >&2; exit 2 ;;
  esac
done

sel="$root/.device/cuda/sel"
rm -rf "$root/.device/cuda"
mkdir -p "$sel"
mapfile -t tests < <(ctest --test-dir "$build" -N -V -L gpu 2>/dev/null | awk '/Test command:/ {print $4}' | sort -u)
[[ ${#tests[@]} -gt 0 ]] || { echo "device_pack: no GPU tests found in $build (built with CUDA?)" >&2; exit 1; }
cp "${tests[@]}" "$sel/"
for b in osprey bench/bench_forward bench/bench_moe_decode; do
  cp "$build/$b" "$sel/"
done
cupti="$(ldd "$build/bench/bench_forward" | awk '/libcupti/ {print $3}')"
[[ -n "$cupti" ]] && cp "$cupti" "$sel/"
if [[ $timeline -eq 1 ]]; then
  tl="${build}-tl"
  if [[ ! -f "$tl/build.ninja" ]]; then
    cmake -S "$root" -B "$tl" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_TIMELINE=ON -DOSPREY_TESTS=OFF \
      -DOSPREY_SHARED_DIR="${OSPREY_SHARED_DIR:-$root/../shared}" > /dev/null
  fi
  ninja -C "$tl" bench_forward
  cp "$tl/bench/bench_forward" "$sel/bench_forward_tl"
fi
for p in "${extra[@]}"; do cp "$p" "$sel/"; done
for f in "$sel"/*; do
  [[ "$f" == *.so* ]] || strip --strip-debug "$f"
done
tar -cf - -C "$root/.device/cuda" sel | xz -2 -T2 > "$root/.device/bin.tar.xz"
size=$(stat -c %s "$root/.device/bin.tar.xz")
echo "device_pack: $(ls "$sel" | wc -l) files, .device/bin.tar.xz $((size / 1048576)) MiB"
[[ $size -lt $((62 * 1048576)) ]] || { echo "device_pack: over the 64 MiB carry limit" >&2; exit 1; }
