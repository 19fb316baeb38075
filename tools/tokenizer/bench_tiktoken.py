#!/usr/bin/env python3
"""tiktoken's single-thread encode throughput on the same corpus as bench/bench_tokenizer.

  bench_tiktoken.py CORPUS.jsonl [--rank-file FILE] [--passes 3]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import o200k_reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--rank-file")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    enc = o200k_reference.encoding(args.rank_file)
    load_s = time.perf_counter() - t0
    docs = [json.loads(line) for line in open(args.corpus, encoding="utf-8")]
    n_bytes = sum(len(d["text"].encode("utf-8")) for d in docs)
    best = float("inf")
    n_tokens = 0
    for _ in range(args.passes):
        n_tokens = 0
        t0 = time.perf_counter()
        for d in docs:
            if d["mode"] == "ordinary":
                n_tokens += len(enc.encode_ordinary(d["text"]))
            else:
                n_tokens += len(enc.encode(d["text"], allowed_special="all"))
        best = min(best, time.perf_counter() - t0)
    print(f"tiktoken {tiktoken_version()} load {load_s:.2f} s; {len(docs)} documents, {n_bytes / 1e6:.1f} MB, "
          f"{n_tokens} tokens; encode {best:.2f} s (best of {args.passes}): {n_bytes / 1e6 / best:.2f} MB/s, "
          f"{n_tokens / best:.0f} tokens/s")


def tiktoken_version():
    import tiktoken

    return tiktoken.__version__


if __name__ == "__main__":
    main()
