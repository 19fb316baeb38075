"""Builds the reference tiktoken Encoding for o200k_harmony from a local rank file (no network).

The pattern and special tokens are those of tiktoken's o200k_harmony (shared/spec/harmony.md §1).
Imported by the differential and export scripts in this folder.
"""
import os

import tiktoken
from tiktoken.load import load_tiktoken_bpe

PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def special_tokens():
    named = {
        "<|startoftext|>": 199998,
        "<|endoftext|>": 199999,
        "<|reserved_200000|>": 200000,
        "<|reserved_200001|>": 200001,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|reserved_200004|>": 200004,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|reserved_200009|>": 200009,
        "<|reserved_200010|>": 200010,
        "<|reserved_200011|>": 200011,
        "<|call|>": 200012,
    }
    named["<|endofprompt|>"] = 200018  # inherited from o200k_base
    named.update({f"<|reserved_{i}|>": i for i in range(200013, 201088)})
    return named


def default_rank_file():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [
        os.environ.get("OSPREY_TIKTOKEN_FILE", ""),
        os.path.join(here, "..", "..", "..", "shared", "data", "o200k_base.tiktoken"),
        "/work/shared/data/o200k_base.tiktoken",
    ]
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    raise SystemExit("o200k_base.tiktoken not found: set OSPREY_TIKTOKEN_FILE")


def encoding(rank_file=None):
    ranks = load_tiktoken_bpe(rank_file or default_rank_file())
    return tiktoken.Encoding(
        name="o200k_harmony_local",
        pat_str=PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=special_tokens(),
    )
