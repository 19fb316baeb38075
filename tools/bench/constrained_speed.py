#!/usr/bin/env python3
"""Decode speed with and without structured output against a running `osprey serve` (issue 15's
mask-cost measurement): C clients send non-streamed /v1/completions requests at once, each for
--max-tokens tokens, first unconstrained (ignore_eos), then with a JSON schema whose string member
keeps a random-weight model writing until the limit. Prints completion tokens/s per concurrency.
Standard library only.
  usage: constrained_speed.py [--url http://127.0.0.1:8000] [--concurrency 1,64] [--max-tokens 128]
"""
import argparse
import json
import threading
import time
import urllib.request

SCHEMA = {"type": "json_schema", "json_schema": {"name": "note", "strict": True, "schema": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
    "additionalProperties": False}}}


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(url, model, clients, max_tokens, constrained):
    body = {"model": model, "prompt": "Write a note:", "max_tokens": max_tokens, "temperature": 0}
    if constrained:
        body["response_format"] = SCHEMA
    else:
        body["ignore_eos"] = True
    tokens = [0] * clients
    errors = []

    def client(i):
        try:
            tokens[i] = post(url, body)["usage"]["completion_tokens"]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit("request failed: " + errors[0])
    return sum(tokens), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    model = json.loads(urllib.request.urlopen(a.url + "/v1/models").read())["data"][0]["id"]
    run(a.url, model, 2, 16, True)  # warm-up: compile the schema, fill the mask cache, capture graphs
    run(a.url, model, 2, 16, False)
    for c in [int(x) for x in a.concurrency.split(",")]:
        plain_tokens, plain_wall = run(a.url, model, c, a.max_tokens, False)
        json_tokens, json_wall = run(a.url, model, c, a.max_tokens, True)
        p, j = plain_tokens / plain_wall, json_tokens / json_wall
        print(f"concurrency {c}: unconstrained {plain_tokens} tokens {p:.1f} tokens/s; "
              f"json_schema {json_tokens} tokens {j:.1f} tokens/s; ratio {j / p:.3f}")


if __name__ == "__main__":
    main()
