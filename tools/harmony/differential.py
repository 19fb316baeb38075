#!/usr/bin/env python3
"""Differential cases for Osprey's Harmony renderer and parser, produced by the official
openai-harmony package (pip install openai-harmony==0.0.8).

Generates random conversations (system messages with every optional field, built-in and custom tool
namespaces, developer instructions and function tools with varied JSON schemas, user/assistant/tool
messages with channels, recipients and content types, unicode text) and random well-formed completion
streams, renders/parses them with openai-harmony, and writes one JSON case per line:

  {"kind": "render", "mode": "completion"|"conversation"|"training", "next_role": "assistant"|...,
   "auto_drop_analysis": bool, "conversation": <Conversation JSON>, "tokens": [...]}
  {"kind": "parse", "role": "assistant"|null, "tokens": [...], "messages": [<Message JSON>...],
   "deltas": [[token_index, "text"], ...]}     # StreamableParser.last_content_delta after each token

tests/harmony/test_differential.cpp replays the file against the C++ code (env
OSPREY_HARMONY_DIFF_CASES=path; without it, the small committed tests/harmony/data/differential_cases.jsonl).

The conversation JSON is exactly openai-harmony's Conversation.to_json(), which `osprey render` reads.
openai-harmony loads o200k_base from TIKTOKEN_ENCODINGS_BASE; this script points it at a temporary folder
holding a link to shared/data/o200k_base.tiktoken, so no network is needed.

  python tools/harmony/differential.py --conversations 1000 --streams 1000 --seed 1 --out /tmp/cases.jsonl
"""
import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def setup_encoding(shared_dir):
    rank_file = Path(shared_dir) / "data" / "o200k_base.tiktoken"
    if not rank_file.exists():
        sys.exit(f"rank file not found: {rank_file} (pass --shared)")
    enc_dir = Path(tempfile.mkdtemp(prefix="osprey-tiktoken-"))
    (enc_dir / "o200k_base.tiktoken").symlink_to(rank_file.resolve())
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(enc_dir)
    import openai_harmony as oh  # after the environment is set

    return oh, oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)


# ---------------------------------------------------------------------------------------------
# Random text
# ---------------------------------------------------------------------------------------------

WORDS = ["the", "weather", "in", "Tokyo", "is", "sunny", "What", "2 + 2", "=", "4.", "café", "naïve", "Größe",
         "東京", "天気", "你好", "世界", "привет", "مرحبا", "שלום", "नमस्ते", "😀", "💖", "👩‍💻", "🇯🇵", "e\u0301",
         "{\"a\": 1}", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
         "to=functions.x", "json", "\t", "   ", "\n", "\n\n", "\r\n", "x" * 40, "1234567", "3.14", "'", "\"", "\\",
         "`code`", "【6†L9-L11】", "\u00a0", "\u3000", "\u200b"]


def rand_text(rng, max_words=30, allow_empty=True):
    n = rng.randint(0 if allow_empty else 1, max_words)
    out = ""
    for _ in range(n):
        out += rng.choice(WORDS) + rng.choice(["", " ", " ", " ", "\n", ", "])
    return out


def rand_ident(rng):
    pool = ["location", "city", "format", "unit", "q", "topn", "items", "nested", "días", "città", "x1", "_private",
            "camelCase", "with-dash", "a" * 12]
    return rng.choice(pool) + (str(rng.randint(0, 99)) if rng.random() < 0.3 else "")


def rand_tool_name(rng):
    return rng.choice(["get_weather", "lookup", "search", "run_code", "sendEmail", "f", "tool_2", "über"]) + (
        str(rng.randint(0, 9)) if rng.random() < 0.3 else "")


# ---------------------------------------------------------------------------------------------
# Random JSON schemas
# ---------------------------------------------------------------------------------------------

FLOATS = [0.5, 1.0, -2.25, 1e20, 1e-7, 3.14159, 123456789.125, 1e16, 1e15, 0.0001, 1.5e-5, -0.0, 2.5e-300, 1e300]


def rand_json_value(rng, depth=0):
    r = rng.random()
    if r < 0.25:
        return rand_text(rng, 4)
    if r < 0.4:
        return rng.choice([0, 1, -1, 10, 42, -300, 2**53, 2**62, 10**20])
    if r < 0.55:
        return rng.choice(FLOATS) if rng.random() < 0.6 else rng.uniform(-1e6, 1e6)
    if r < 0.65:
        return rng.choice([True, False])
    if r < 0.72:
        return None
    if depth > 1:
        return "leaf"
    if r < 0.86:
        return [rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rand_ident(rng): rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def decorate(rng, s, allow_default=True):
    if rng.random() < 0.4:
        s["description"] = rand_text(rng, 8, allow_empty=False)
    if rng.random() < 0.15:
        s["title"] = rand_text(rng, 3, allow_empty=False)
    if rng.random() < 0.12:
        s["examples"] = [rand_text(rng, 3) if rng.random() < 0.8 else rng.randint(0, 9) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.15:
        s["nullable"] = rng.random() < 0.7
    if allow_default and rng.random() < 0.3:
        s["default"] = rand_json_value(rng)
    return s


def rand_schema(rng, depth=0):
    r = rng.random()
    if depth >= 3:
        r = r * 0.5
    if r < 0.18:
        s = {"type": "string"}
        if rng.random() < 0.35:
            s["enum"] = [rand_text(rng, 2, allow_empty=False) if rng.random() < 0.85 else rng.randint(0, 5)
                         for _ in range(rng.randint(0, 4))]
        return decorate(rng, s)
    if r < 0.28:
        return decorate(rng, {"type": rng.choice(["number", "integer"])})
    if r < 0.34:
        return decorate(rng, {"type": "boolean"})
    if r < 0.38:
        return decorate(rng, {"type": rng.choice(["null"])} if rng.random() < 0.5 else {})
    if r < 0.44:
        return decorate(rng, {"type": rng.sample(["number", "string", "integer", "boolean", "null", "array"],
                                                  rng.randint(1, 3))})
    if r < 0.56:
        s = {"type": "array"}
        if rng.random() < 0.8:
            s["items"] = rand_schema(rng, depth + 1)
        return decorate(rng, s)
    if r < 0.68:
        s = {"oneOf": [rand_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
        if rng.random() < 0.3:
            s["type"] = rng.choice(["string", "object"])
        return decorate(rng, s)
    return rand_object_schema(rng, depth)


def rand_object_schema(rng, depth=0):
    s = {"type": "object"}
    if rng.random() < 0.9:
        props = {}
        for _ in range(rng.randint(0, 5)):
            props[rand_ident(rng)] = rand_schema(rng, depth + 1)
        s["properties"] = props
        if props and rng.random() < 0.7:
            s["required"] = rng.sample(list(props), rng.randint(0, len(props))) + (
                ["not_a_property"] if rng.random() < 0.1 else [])
    return decorate(rng, s, allow_default=depth > 0)


def rand_tool(rng):
    t = {"name": rand_tool_name(rng), "description": rand_text(rng, 12)}
    if rng.random() < 0.1:
        t["description"] += rng.choice(["\r\nsecond line", "\nthird\n", "\r", "\n\n"])
    if rng.random() < 0.85:
        t["parameters"] = rand_object_schema(rng) if rng.random() < 0.9 else rand_schema(rng)
    return t


def rand_namespace(rng, oh, name=None):
    r = rng.random()
    if name is None and r < 0.25:
        return oh.ToolNamespaceConfig.browser().model_dump()
    if name is None and r < 0.4:
        return oh.ToolNamespaceConfig.python().model_dump()
    name = name or rng.choice(["functions", "myspace", "containers", "ns_2"])
    ns = {"name": name, "tools": [rand_tool(rng) for _ in range(rng.randint(0 if name != "functions" else 0, 4))]}
    if rng.random() < 0.5:
        ns["description"] = rand_text(rng, 10) + (rng.choice(["\nline two", "\r\nline", ""]) if rng.random() < 0.3 else "")
    return ns


# ---------------------------------------------------------------------------------------------
# Random messages
# ---------------------------------------------------------------------------------------------

CHANNELS = ["analysis", "commentary", "final"]


def rand_system(rng, oh):
    c = {"type": "system_content"}
    opt = lambda p: rng.random() < p
    if opt(0.3):
        c["model_identity"] = None if opt(0.3) else rand_text(rng, 8)
    if opt(0.5):
        c["reasoning_effort"] = None if opt(0.1) else rng.choice(["Low", "Medium", "High"])
    if opt(0.5):
        c["conversation_start_date"] = rng.choice(["2025-06-28", "2021-01-01", "1999-12-31T23:59:59"])
    if opt(0.2):
        c["knowledge_cutoff"] = None if opt(0.3) else rng.choice(["2021-01", "2024-06", "yesterday"])
    if opt(0.3):
        c["channel_config"] = None if opt(0.2) else {
            "valid_channels": rng.sample(CHANNELS + ["other"], rng.randint(0, 4)), "channel_required": opt(0.5)}
    if opt(0.5):
        tools = {}
        for _ in range(rng.randint(0, 3)):
            ns = rand_namespace(rng, oh)
            tools[ns["name"]] = ns
        c["tools"] = tools
    return {"role": "system", "content": [c]}


def rand_developer(rng, oh):
    c = {"type": "developer_content"}
    if rng.random() < 0.7:
        c["instructions"] = rand_text(rng, 20)
    if rng.random() < 0.7:
        tools = {}
        if rng.random() < 0.9:
            tools["functions"] = rand_namespace(rng, oh, "functions")
        if rng.random() < 0.2:
            ns = rand_namespace(rng, oh, rng.choice(["myspace", "zeta", "alpha"]))
            tools[ns["name"]] = ns
        c["tools"] = tools
    return {"role": "developer", "content": [c]}


def rand_assistant(rng, header_safe=False):
    m = {"role": "assistant", "content": rand_text(rng, 25)}
    r = rng.random()
    if r < 0.4:
        m["channel"] = "analysis"
    elif r < 0.7:
        m["channel"] = "final"
    elif r < 0.95:
        m["channel"] = "commentary"
    if rng.random() < 0.3:
        m["recipient"] = rng.choice(["functions." + rand_tool_name(rng), "browser.search", "browser.open", "python",
                                     "all" if not header_safe else "python"])
        if rng.random() < 0.7:
            m["content_type"] = rng.choice(["<|constrain|>json", "json", "code"])
    elif not header_safe and rng.random() < 0.05:
        m["content_type"] = "json"
    if rng.random() < 0.05 and not header_safe:
        m["name"] = "helper"
    return m


def rand_tool_result(rng, header_safe=False):
    m = {"role": "tool", "name": rng.choice(["functions." + rand_tool_name(rng), "browser.search", "python"]),
         "content": rand_text(rng, 15)}
    if header_safe or rng.random() < 0.7:
        m["recipient"] = "assistant"
        m["channel"] = "commentary" if rng.random() < 0.8 else "analysis"
    return m


def rand_user(rng):
    m = {"role": "user", "content": rand_text(rng, 20)}
    if rng.random() < 0.1:
        m["name"] = rng.choice(["alice", "bob_2"])
    return m


def rand_conversation(rng, oh):
    msgs = []
    if rng.random() < 0.85:
        msgs.append(rand_system(rng, oh))
    if rng.random() < 0.6:
        msgs.append(rand_developer(rng, oh))
    for _ in range(rng.randint(0, 8)):
        r = rng.random()
        if r < 0.3:
            msgs.append(rand_user(rng))
        elif r < 0.8:
            msgs.append(rand_assistant(rng))
        else:
            msgs.append(rand_tool_result(rng))
    return {"messages": msgs}


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


def render_case(rng, oh, enc):
    conv = rand_conversation(rng, oh)
    convo = oh.Conversation.from_json(json.dumps(conv))
    drop = rng.random() < 0.7
    cfg = oh.RenderConversationConfig(auto_drop_analysis=drop)
    mode = rng.choices(["completion", "conversation", "training"], [0.7, 0.15, 0.15])[0]
    next_role = None
    if mode == "completion":
        next_role = rng.choice(["assistant"] * 4 + ["user", "tool"])
        tokens = enc.render_conversation_for_completion(convo, oh.Role(next_role), cfg)
    elif mode == "conversation":
        tokens = enc.render_conversation(convo, cfg)
    else:
        tokens = enc.render_conversation_for_training(convo, cfg)
    # The JSON that Conversation.from_json read (absent system fields = defaults, null = not rendered).
    return {"kind": "render", "mode": mode, "next_role": next_role, "auto_drop_analysis": drop,
            "conversation": conv, "tokens": list(tokens)}


def parse_case(rng, oh, enc):
    completion = rng.random() < 0.6
    msgs = []
    n = rng.randint(1, 5)
    for i in range(n):
        r = rng.random()
        if completion and i == 0 or r < 0.7:
            msgs.append(rand_assistant(rng, header_safe=True))
        elif r < 0.85 or completion:
            msgs.append(rand_tool_result(rng, header_safe=True))
        else:
            msgs.append(rand_user(rng) if rng.random() < 0.7 else {"role": "developer", "content": rand_text(rng, 8)})
    tokens = []
    for m in msgs:
        if m["role"] != "tool":
            m.pop("name", None)  # "user:alice" is not a header harmony's parser reads back
        tokens += enc.render(oh.Message.from_dict(m))
    if completion:
        tokens = tokens[2:]  # the prompt ended with <|start|>assistant
    if rng.random() < 0.3:
        tokens = tokens[: rng.randint(max(0, len(tokens) // 2), len(tokens))]  # cut mid-stream
    role = oh.Role.ASSISTANT if completion else None
    parser = oh.StreamableParser(enc, role)
    deltas = []
    try:
        for i, t in enumerate(tokens):
            parser.process(t)
            d = parser.last_content_delta
            if d is not None:
                deltas.append([i, d])
        parser.process_eos()
    except Exception:
        return None  # harmony rejects it (e.g. cut inside a header): not a well-formed stream
    return {"kind": "parse", "role": "assistant" if completion else None, "tokens": list(tokens),
            "messages": [m.to_dict() for m in parser.messages], "deltas": deltas}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shared", default=str(REPO.parent / "shared"), help="the shared/ folder (rank file)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    oh, enc = setup_encoding(args.shared)
    rng = random.Random(args.seed)
    n_render = n_parse = n_skipped = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for _ in range(args.conversations):
            f.write(json.dumps(render_case(rng, oh, enc), ensure_ascii=False) + "\n")
            n_render += 1
        while n_parse < args.streams:
            case = parse_case(rng, oh, enc)
            if case is None:
                n_skipped += 1
                continue
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
            n_parse += 1
    print(f"wrote {n_render} render cases and {n_parse} parse cases to {args.out} "
          f"({n_skipped} cut streams harmony rejects were skipped)")


if __name__ == "__main__":
    main()
