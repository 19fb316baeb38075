#!/usr/bin/env python3
"""Checks `osprey tokenize --export-hf-json` with Hugging Face's own `tokenizers` library: the
exported tokenizer.json must load there and give tiktoken's ids on a generated corpus, and the file
as tokenizers saves it back must load in Osprey with the same ids.

Documents containing "<|" are left out: Hugging Face always matches added (special) tokens, which has
no tiktoken encode_ordinary equivalent. Exits 77 (a CTest skip) when tiktoken or tokenizers is missing.

  check_hf_export.py --osprey BUILD/osprey --rank-file o200k_base.tiktoken [--mb 3] [--seed 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--rank-file", required=True)
    ap.add_argument("--mb", type=float, default=float(os.environ.get("OSPREY_TOKENIZER_HF_MB", "3")))
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args()
    try:
        sys.path.insert(0, HERE)
        import o200k_reference
        from tokenizers import Tokenizer
    except ImportError as e:
        print(f"SKIP: {e}; pip install tiktoken tokenizers")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        subprocess.run([args.osprey, "tokenize", "--tokenizer", args.rank_file, "--export-hf-json", path], check=True)
        corpus = os.path.join(tmp, "corpus.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "gen_corpus.py"), "--seed", str(args.seed), "--mb",
                        str(args.mb), "--no-every-code-point", "--out", corpus], check=True)
        hf = Tokenizer.from_file(path)
        enc = o200k_reference.encoding(args.rank_file)
        texts = [d["text"] for d in map(json.loads, open(corpus, encoding="utf-8")) if "<|" not in d["text"]]
        texts.append("".join(chr(c) for c in range(0x20, 0x3000) if not 0xD800 <= c < 0xE000))
        got = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        want = enc.encode_ordinary_batch(texts, num_threads=2)
        bad = [k for k in range(len(texts)) if got[k] != want[k]]
        for k in bad[:3]:
            print(f"MISMATCH document {k}: tokenizers {got[k][:20]} vs tiktoken {want[k][:20]}")
        specials = hf.encode("<|start|>user<|message|>hi<|end|><|endofprompt|>", add_special_tokens=False).ids
        if specials != [200006, 1428, 200008, 3686, 200007, 200018]:
            print(f"MISMATCH added tokens: {specials}")
            bad.append(-1)
        # What tokenizers itself writes (its own serialisation of the file) must load in Osprey too.
        resaved = os.path.join(tmp, "resaved", "tokenizer.json")
        os.makedirs(os.path.dirname(resaved))
        hf.save(resaved)
        sample = "Grüße, 日本語 and 👍🏽 <|start|>   12345\n"
        out = subprocess.run([args.osprey, "tokenize", "--model", os.path.dirname(resaved), "--allow-special", sample],
                             check=True, capture_output=True, text=True).stdout.split()
        if [int(x) for x in out] != enc.encode(sample, allowed_special="all"):
            print(f"MISMATCH osprey on the re-saved tokenizer.json: {out}")
            bad.append(-2)
        print(f"{len(texts) + 2 - len(bad)} passed, {len(bad)} failed")
        return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
