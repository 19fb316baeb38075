#!/usr/bin/env python3
"""A/B runs of `osprey bench decode` under environment variants, alternated to spread drift.

Each round runs every variant once, in order (round r: A, B, C, ...), with the same bench arguments;
the table gives each variant's median total tokens/s per (context, batch) over the rounds, the rounds'
values, and the ratio to the first variant. What the eighth session did by hand for every A/B knob
(docs/performance.md), as one command:

  scripts/decode_ab.py --osprey BIN --rounds 2 --variant base= --variant one=OSPREY_MOE_DECODE_CTAS_PER_SM=1 \\
      -- --model /dev/shm/m20 --contexts 1024 --batches 1,8 --steps 64

A variant is NAME=ENV, ENV being space-separated VAR=VALUE pairs (empty: the environment as is), or
NAME@BINARY=ENV to run another osprey binary (an old build against a new one, alternated the same way:
`--variant old@/tmp/old/osprey= --variant new=`). The
bench's own output goes to OUT/<name>-<round>.md (--out, default a temporary folder); a run that fails
is reported with its exit status and the end of its output, and counts as missing in the table.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"decode context (\d+) batch (\d+): step median ([0-9.]+) ms.*?([0-9.]+) tokens/s total")


def parse_variant(text):
    """(name, env pairs, binary or None) from NAME[@BINARY]=ENV."""
    head, sep, env = text.partition("=")
    name, _, binary = head.partition("@")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or ("@" in head and not binary):
        raise argparse.ArgumentTypeError(
            f"variant '{text}' is not NAME=ENV or NAME@BINARY=ENV (NAME of letters, digits, _ . -)")
    if binary and not os.access(binary, os.X_OK):
        raise argparse.ArgumentTypeError(f"variant '{name}': {binary} is not an executable")
    pairs = {}
    for item in env.split():
        var, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
            raise argparse.ArgumentTypeError(f"variant '{name}': '{item}' is not VAR=VALUE")
        pairs[var] = value
    return name, pairs, binary or None


def parse_output(text):
    """{(context, batch): tokens/s total} from a bench decode log."""
    return {(int(m[1]), int(m[2])): float(m[4]) for m in LINE.finditer(text)}


def run(osprey, bench_args, env_pairs, log_path):
    env = dict(os.environ)
    env.update(env_pairs)
    out_prefix = os.path.splitext(log_path)[0]
    cmd = [osprey, "bench", "decode", *bench_args, "--out", out_prefix]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    with open(log_path, "w") as f:
        f.write(text)
    return proc.returncode, text


def table(variants, results):
    """Markdown: a row per (context, batch), a column per variant."""
    keys = sorted({k for per_round in results.values() for r in per_round for k in r})
    names = [v[0] for v in variants]
    head = "| context | batch | " + " | ".join(f"{n} (tokens/s)" for n in names) + " |"
    rows = [head, "|---:|---:|" + "---:|" * len(names)]
    for key in keys:
        cells, base = [], None
        for i, name in enumerate(names):
            values = [r[key] for r in results[name] if key in r]
            if not values:
                cells.append("–")
                continue
            med = statistics.median(values)
            if i == 0:
                base = med
            ratio = f", {med / base:.3f}x" if base and i > 0 else ""
            cells.append(f"{med:.1f} ({' / '.join(f'{v:.1f}' for v in values)}{ratio})")
        rows.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv):
    if "--" not in argv:
        print("decode_ab: the bench arguments follow '--' (see --help)", file=sys.stderr)
        if "-h" not in argv and "--help" not in argv:
            return 2
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--osprey", default="build/osprey", help="the osprey binary (default build/osprey)")
    p.add_argument("--rounds", type=int, default=2, help="runs of every variant, alternated (default 2)")
    p.add_argument("--variant", type=parse_variant, action="append", required=True,
                   help="NAME=ENV or NAME@BINARY=ENV (repeatable)")
    p.add_argument("--out", help="folder for the bench logs (default: a temporary folder)")
    a = p.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    names = [v[0] for v in a.variant]
    if len(set(names)) != len(names):
        p.error("variant names must differ")
    if not os.access(a.osprey, os.X_OK):
        p.error(f"--osprey {a.osprey} is not an executable")
    out = a.out or tempfile.mkdtemp(prefix="decode_ab-")
    os.makedirs(out, exist_ok=True)
    results = {n: [] for n in names}
    failures = 0
    for r in range(a.rounds):
        for name, env, binary in a.variant:
            log = os.path.join(out, f"{name}-{r + 1}.md")
            rc, text = run(binary or a.osprey, bench_args, env, log)
            parsed = parse_output(text)
            summary = "; ".join(f"c{c} b{b} {v:.1f}" for (c, b), v in sorted(parsed.items()))
            print(f"round {r + 1} {name}: rc {rc}: {summary}", flush=True)
            if rc != 0 or not parsed:
                failures += 1
                print("  " + "\n  ".join(text.strip().splitlines()[-3:]), flush=True)
            results[name].append(parsed if rc == 0 else {})
    print()
    print(table(a.variant, results))
    print(f"\nlogs: {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
