"""Checks constrained decoding's token masks against an independent reference, over the whole o200k
vocabulary, on many generated JSON schemas and prefixes (and some regular expressions).

The reference does not share code or structure with the C++ compiler: it translates each generated
schema into a regular expression of its JSON texts (no whitespace but one optional space after ','
and ':'; enum and const values compact) (objects as an alternation over the
ordered subsets of their properties), and a token is allowed after a prefix exactly when the
`regex` package's partial matching says prefix + token can still become a full match. Prefixes are
cut at random points of random valid instances (checked with `jsonschema`). Tokens that end inside
a UTF-8 character cannot be decoded for the reference and are skipped (the C++ tests check them
against the automaton directly: tests/grammar/test_token_mask.cpp).

xgrammar would be the natural oracle, but its wheel requires torch (several GB with CUDA) and imports
it at start-up, so this reference stands in for it.

    python tests/grammar/oracle_check.py --masks build/tests/grammar/grammar_masks --rank-file o200k_base.tiktoken
"""
import argparse
import base64
import json
import random
import subprocess
import sys
import time

import jsonschema
import regex

STR_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
INT = r"-?(?:0|[1-9][0-9]*)"
NUM = INT + r"(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
PATTERNS = ["^[a-z]{2,5}$", "^[A-Z][0-9]{2}$", "^(ab|cd)+x?$", "^é[à-ÿ]{1,3}$"]
WORDS = ["a", "bc", "déf", "日本", "x y", "q\"", "tab\t"]


def dump(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def lit(v):
    """An enum or const value: written compactly, as the constraint does."""
    return regex.escape(dump(v))


def to_regex(s):
    if "enum" in s:
        return "(?:" + "|".join(lit(v) for v in s["enum"]) + ")"
    if "const" in s:
        return lit(s["const"])
    if "anyOf" in s:
        return "(?:" + "|".join(to_regex(x) for x in s["anyOf"]) + ")"
    t = s["type"]
    if t == "string":
        if "pattern" in s:
            return '"' + s["pattern"].lstrip("^").rstrip("$") + '"'
        hi = s.get("maxLength")
        return '"' + STR_CHAR + "{%d,%s}" % (s.get("minLength", 0), "" if hi is None else hi) + '"'
    if t == "integer":
        return INT
    if t == "number":
        return NUM
    if t == "boolean":
        return "(?:true|false)"
    if t == "null":
        return "null"
    if t == "array":
        item = to_regex(s["items"])
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if hi == 0:
            return r"\[\]"
        body = item + "(?:, ?" + item + "){%d,%s}" % (max(lo - 1, 0), "" if hi is None else hi - 1)
        return r"\[" + ("(?:" + body + ")?" if lo == 0 else body) + r"\]"
    assert t == "object"
    props = list(s["properties"].items())
    req = set(s.get("required", []))
    alts = []
    for m in range(1 << len(props)):
        chosen = [p for i, p in enumerate(props) if m >> i & 1]
        if not req <= {k for k, _ in chosen}:
            continue
        alts.append(", ?".join(lit(k) + ": ?" + to_regex(v) for k, v in chosen))
    return r"\{(?:" + "|".join(alts) + r")\}"


def gen_schema(rng, depth):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "pattern", "bounded"]
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf"]
    k = rng.choice(kinds)
    if k == "enum":
        return {"enum": rng.sample(["red", "green", "é", 1, 2.5, None, True, [1], {"a": 1}], rng.randint(1, 4))}
    if k == "const":
        return {"const": rng.choice(["fixed", 7, {"k": [None]}])}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if k == "bounded":
        lo = rng.randint(0, 2)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 4)}
    if k == "object":
        n = rng.randint(0, 4)
        props = {f"p{i}" if rng.random() < 0.7 else f"ключ{i}": gen_schema(rng, depth + 1) for i in range(n)}
        req = [p for p in props if rng.random() < 0.5]
        return {"type": "object", "properties": props, "required": req, "additionalProperties": False}
    if k == "array":
        lo = rng.randint(0, 2)
        s = {"type": "array", "items": gen_schema(rng, depth + 1), "minItems": lo}
        if rng.random() < 0.7:
            s["maxItems"] = lo + rng.randint(0, 3)
        return s
    if k == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    return {"type": k}


def gen_value(rng, s):
    if "enum" in s:
        return rng.choice(s["enum"])
    if "const" in s:
        return s["const"]
    if "anyOf" in s:
        return gen_value(rng, rng.choice(s["anyOf"]))
    t = s["type"]
    if t == "string":
        if "pattern" in s:
            return {PATTERNS[0]: "abcd", PATTERNS[1]: "Q42", PATTERNS[2]: "abcdabx", PATTERNS[3]: "éàÿ"}[s["pattern"]]
        n = rng.randint(s.get("minLength", 0), s.get("maxLength", 6))
        return "".join(rng.choice("abé日\"\\\n") for _ in range(n))
    if t == "integer":
        return rng.choice([0, -7, 123456])
    if t == "number":
        return rng.choice([0.5, -1e-07, 3, 12.25])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        n = rng.randint(s.get("minItems", 0), s.get("maxItems", s.get("minItems", 0) + 2))
        return [gen_value(rng, s["items"]) for _ in range(n)]
    return {k: gen_value(rng, v) for k, v in s["properties"].items() if k in s["required"] or rng.random() < 0.5}


def load_tokens(path):
    tokens = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                tokens[int(rank)] = base64.b64decode(b64)
    return tokens


def reference(pattern, prefix, tokens):
    """(allowed ids, ids it cannot judge) by partial matching of prefix + each token."""
    pat = regex.compile(pattern)
    allowed, undecidable = set(), set()
    for tid, b in tokens.items():
        try:
            text = (prefix + b).decode("utf-8")
        except UnicodeDecodeError as e:
            if e.reason == "unexpected end of data":
                undecidable.add(tid)
            continue  # invalid UTF-8 can never be allowed
        if pat.fullmatch(text, partial=True):
            allowed.add(tid)
    return allowed, undecidable


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--masks", required=True)
    p.add_argument("--rank-file", required=True)
    p.add_argument("--schemas", type=int, default=7)  # ~3 masks each: ~25 s on 2 cores (24: 105 s)
    p.add_argument("--seed", type=int, default=2026)
    args = p.parse_args()
    tokens = load_tokens(args.rank_file)
    rng = random.Random(args.seed)

    queries = []  # (kind, spec, reference regex, prefix)
    for _ in range(args.schemas):
        schema = gen_schema(rng, 0)
        value = gen_value(rng, schema)
        jsonschema.validate(value, schema)
        text = dump(value)
        assert regex.fullmatch(to_regex(schema), text), (schema, text)
        for cut in sorted({0, rng.randint(0, len(text)), rng.randint(0, len(text))}):
            queries.append(("json_schema", schema, to_regex(schema), text[:cut]))
    for pattern, prefix in [("[0-9]{2,4}(px|em)", "12"), ("(?:foo|bar)+[.!]?", "foob"), ("[^a-z]{0,3}é+", "")]:
        queries.append(("regex", pattern, pattern, prefix))

    proc = subprocess.Popen([args.masks, args.rank_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    failures, compared, skipped_total = 0, 0, 0
    start = time.time()
    for kind, spec, pattern, prefix in queries:
        proc.stdin.write(json.dumps({"kind": kind, "spec": spec, "prefix": prefix}) + "\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        if "error" in got:
            print(f"FAIL {kind} {json.dumps(spec)} prefix {prefix!r}: {got['error']}")
            failures += 1
            continue
        want, undecidable = reference(pattern, prefix.encode("utf-8"), tokens)
        skipped_total += len(undecidable)
        have = set(got["allowed"])
        # Tokens the reference cannot judge (ending mid-character) are left out of the comparison.
        extra, missing = (have - want) - undecidable, (want - have)
        accepts = regex.fullmatch(pattern, prefix) is not None
        if extra or missing or accepts != got["accepts"]:
            failures += 1
            print(f"FAIL {kind} {json.dumps(spec, ensure_ascii=False)} prefix {prefix!r}: "
                  f"{len(extra)} allowed but refused by the reference (e.g. {[tokens[t] for t in list(extra)[:5]]}), "
                  f"{len(missing)} missing (e.g. {[tokens[t] for t in list(missing)[:5]]}), "
                  f"accepts {got['accepts']} vs {accepts}")
        compared += 1
    proc.stdin.close()
    proc.wait()
    print(f"{compared} masks compared over {len(tokens)} tokens ({skipped_total} token checks skipped: they end "
          f"mid-character), {failures} failures, {time.time() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
