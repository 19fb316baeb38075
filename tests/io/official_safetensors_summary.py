"""Summarises a checkpoint folder with the official safetensors library (an implementation nobody here
wrote), so tests can check that Osprey's writer produces files it accepts and that both readers agree.

usage: official_safetensors_summary.py DIR  ->  JSON on stdout:
  {"tensors": {name: {"file": f, "dtype": "BF16", "shape": [..], "u8_sum": int | null}},
   "metadata": {file: {...}}, "index": {"total_size": n, "missing": [...], "extra": [...]} | null}
u8_sum is the byte sum of U8 tensors (numpy cannot hold BF16, so other dtypes are described only).
"""
import json
import os
import sys

import numpy as np
from safetensors import safe_open


def main(folder):
    out = {"tensors": {}, "metadata": {}, "index": None}
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    for name in files:
        with safe_open(os.path.join(folder, name), framework="numpy") as f:  # validates the header
            out["metadata"][name] = f.metadata() or {}
            for key in f.keys():
                s = f.get_slice(key)
                entry = {"file": name, "dtype": s.get_dtype(), "shape": list(s.get_shape()), "u8_sum": None}
                if entry["dtype"] == "U8":
                    entry["u8_sum"] = int(f.get_tensor(key).astype(np.uint64).sum())
                out["tensors"][key] = entry
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as fh:
            index = json.load(fh)
        wm = index["weight_map"]
        out["index"] = {
            "total_size": index["metadata"]["total_size"],
            "missing": sorted(k for k in out["tensors"] if wm.get(k) != out["tensors"][k]["file"]),
            "extra": sorted(k for k in wm if k not in out["tensors"]),
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
