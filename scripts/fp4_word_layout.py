#!/usr/bin/env python3
"""A bit layout of an MXFP4 word (8 nibbles) that decodes to 4 BF16x2 registers in 9 integer operations.

moe_fp4.cuh's decode_fp4x8 turns nibbles (r, r + 4) of a word in the published layout (nibble j at bits
4j..4j+3) into register r, each nibble's sign at bit 15 of its half and e1 e0 m at bits 8 7 6, with
13 integer operations (a shift, then AND, IMAD, AND per register). Stored with its bits permuted, the
same registers come out of:
    r0 = w & P                 r1 = rotr(w, 4) & P        r2 = rotr(w, 10) & P
    r3 = (rotl(w, 2) & M1) | (rotl(w, 10) & M2)
(P = bits {6,7,8,15,22,23,24,31}, M1 = {6,7,15,22,23,31}, M2 = {8,24}): 9 operations. This script
searches for such layouts (three translates of P plus one register from two rotations), builds the
permutation for the first one, and checks on random words that the 9-operation decode of the permuted
word equals decode_fp4x8's registers (before its scale multiply) of the published one.
docs/architecture.md ("The decode step") has the reasoning; kernels/cuda/mxfp4_words.h implements the layout
(moe_decode reads it from an opt-in second copy of the experts) and tests/kernels/test_mxfp4_words.cpp checks it.
"""
import itertools
import random

P = [6, 7, 8, 15, 22, 23, 24, 31]  # lo half: m, e0, e1, sign; hi half the same
N = 32


def rot(t):
    return [(p + t) % N for p in P]


def search():
    for t1 in range(1, N):
        if set(rot(t1)) & set(P):
            continue
        for t2 in range(t1 + 1, N):
            if set(rot(t2)) & (set(P) | set(rot(t1))):
                continue
            rest = sorted(set(range(N)) - set(P) - set(rot(t1)) - set(rot(t2)))
            for s1 in range(N):
                for s2 in range(s1 + 1, N):
                    a = {(r + s1) % N: r for r in rest}
                    b = {(r + s2) % N: r for r in rest}
                    for pick in itertools.product(*[[x for x in (p in a and "a", p in b and "b") if x] for p in P]):
                        src = [a[p] if k == "a" else b[p] for p, k in zip(P, pick)]
                        if len(set(src)) == 8:
                            yield t1, t2, s1, s2, dict(zip(P, pick)), dict(zip(P, src))


def reference(w):
    """decode_fp4x8 before the scale multiply: registers of nibbles (r, r + 4)."""
    hi = w >> 8
    pair = lambda x, mul: (x * mul) & 0x81C081C0 & 0xFFFFFFFF
    return [pair(w & 0x000F000F, 4160), pair(w & 0x00F000F0, 260), pair(hi & 0x000F000F, 4160),
            pair(hi & 0x00F000F0, 260)]


def main():
    t1, t2, s1, s2, which, src3 = next(search())
    rotr = lambda w, n: ((w >> n) | (w << (N - n))) & 0xFFFFFFFF
    rotl = lambda w, n: rotr(w, (N - n) % N)
    m1 = sum(1 << p for p in P if which[p] == "a")
    m2 = sum(1 << p for p in P if which[p] == "b")
    pm = sum(1 << p for p in P)
    # Where register r's bit p sits in the stored word.
    where = [{p: p for p in P}, {p: (p + t1) % N for p in P}, {p: (p + t2) % N for p in P}, src3]
    # Register r's bit p holds, in the published word, bit b of nibble j: sign at 15/31, e1 8/24, e0 7/23, m 6/22.
    role = {6: 0, 7: 1, 8: 2, 15: 3}

    def permute(w):
        out = 0
        for r in range(4):
            for p in P:
                nib = r + (4 if p >= 16 else 0)
                bit = (w >> (4 * nib + role[p % 16])) & 1
                out |= bit << where[r][p]
        return out

    def decode(v):
        return [v & pm, rotr(v, t1) & pm, rotr(v, t2) & pm, (rotl(v, s1) & m1) | (rotl(v, s2) & m2)]

    rng = random.Random(1)
    for _ in range(20000):
        w = rng.getrandbits(32)
        assert decode(permute(w)) == reference(w), hex(w)
    print(f"layout: r1 = rotr {t1}, r2 = rotr {t2}, r3 = rotl {s1} & {m1:#010x} | rotl {s2} & {m2:#010x}; "
          "20000 random words decode as decode_fp4x8 does: 9 integer operations instead of 13")


if __name__ == "__main__":
    main()
