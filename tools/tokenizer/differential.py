#!/usr/bin/env python3
"""Differential test: Osprey's tokenizer against the official tiktoken package, same rank file.

Encodes every document of a corpus (tools/tokenizer/gen_corpus.py) with tiktoken (encode_ordinary, or
encode(allowed_special="all") for "all_special" documents) and compares with the ids that
tests/tokenizer/tokenizer_dump wrote. Exits 0 only with zero mismatches; 77 when tiktoken is missing
(CTest reports a skip).

  differential.py --dump BUILD/tests/tokenizer/tokenizer_dump --rank-file o200k_base.tiktoken \
      [--tokenizer FILE_FOR_DUMP] [--corpus corpus.jsonl | --seed 1 --mb 20]
"""
import argparse
import array
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="the tokenizer_dump executable")
    ap.add_argument("--rank-file", required=True)
    ap.add_argument("--tokenizer", help="file the C++ side loads (default: the rank file)")
    ap.add_argument("--corpus", help="existing corpus; otherwise one is generated")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("OSPREY_TOKENIZER_DIFF_SEED", "1")))
    ap.add_argument("--mb", type=float, default=float(os.environ.get("OSPREY_TOKENIZER_DIFF_MB", "20")))
    args = ap.parse_args()
    try:
        sys.path.insert(0, HERE)
        import o200k_reference
    except ImportError as e:
        print(f"SKIP: the tiktoken package is not installed ({e}); pip install tiktoken")
        return 77

    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus
        if not corpus:
            corpus = os.path.join(tmp, "corpus.jsonl")
            subprocess.run([sys.executable, os.path.join(HERE, "gen_corpus.py"), "--seed", str(args.seed),
                            "--mb", str(args.mb), "--out", corpus], check=True)
        ids_path = os.path.join(tmp, "ids.bin")
        t0 = time.time()
        subprocess.run([args.dump, args.tokenizer or args.rank_file, corpus, ids_path], check=True)
        t_cpp = time.time() - t0

        docs = []
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                docs.append(json.loads(line))
        enc = o200k_reference.encoding(args.rank_file)
        t0 = time.time()
        ordinary = [d["text"] for d in docs if d["mode"] == "ordinary"]
        expected_ordinary = iter(enc.encode_ordinary_batch(ordinary, num_threads=2))
        expected = []
        for d in docs:
            if d["mode"] == "ordinary":
                expected.append(next(expected_ordinary))
            else:
                expected.append(enc.encode(d["text"], allowed_special="all"))
        t_ref = time.time() - t0

        with open(ids_path, "rb") as f:
            blob = f.read()
        pos = 0
        mismatches = 0
        n_tokens = 0
        n_bytes = 0
        for k, d in enumerate(docs):
            (n,) = array.array("I", blob[pos:pos + 4])
            pos += 4
            got = array.array("i", blob[pos:pos + 4 * n])
            if sys.byteorder != "little":
                got.byteswap()
            pos += 4 * n
            want = expected[k]
            n_tokens += len(want)
            n_bytes += len(d["text"].encode("utf-8"))
            if list(got) != want:
                mismatches += 1
                if mismatches <= 5:
                    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                    lo = max(0, i - 3)
                    print(f"MISMATCH document {k} ({d['mode']}) at token {i}:")
                    print(f"  osprey : {list(got[lo:i + 4])} {[enc.decode_single_token_bytes(t) for t in got[lo:i + 4]]}")
                    print(f"  tiktoken: {want[lo:i + 4]} {[enc.decode_single_token_bytes(t) for t in want[lo:i + 4]]}")
        if pos != len(blob):
            print(f"the dump has {len(blob) - pos} trailing bytes")
            mismatches += 1
        print(f"{len(docs)} documents, {n_bytes / 1e6:.1f} MB, {n_tokens} tokens; osprey {t_cpp:.1f} s "
              f"(load + encode + checks), tiktoken {t_ref:.1f} s (2 threads)")
        print(f"{len(docs) - mismatches} passed, {mismatches} failed")
        return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
