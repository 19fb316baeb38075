"""Load test: N concurrent streaming chat clients (default 200) against `osprey serve` on the tiny model.
Every stream must complete without error, carry one id of its own, and hold exactly the text a
non-streaming request with the same prompt and seed gives afterwards (so nothing was lost or mixed
up between clients). Prints throughput and latency percentiles.

    python tools/server/load_test.py --osprey build/osprey --build-dir build --shared-dir ../shared [--clients 200]
    python tools/server/load_test.py --url http://127.0.0.1:8000 --model NAME   (a running server)
"""
import argparse
import asyncio
import os
import sys
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import OspreyServer, test_env  # noqa: E402


async def one_client(client, model, i, max_tokens, started):
    await started.wait()
    t0 = time.perf_counter()
    first = None
    content, reasoning, ids, finish, usage = "", "", set(), None, None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"Client {i}: tell me about the number {i}."}],
        max_tokens=max_tokens, seed=1000 + i, temperature=1.0, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if (c.delta.content or getattr(c.delta, "reasoning_content", None)) and first is None:
                first = time.perf_counter() - t0
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    return {"i": i, "content": content, "reasoning": reasoning, "ids": ids, "finish": finish, "usage": usage, "ttft": first,
            "e2e": time.perf_counter() - t0}


async def replay(client, model, i, max_tokens):
    r = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"Client {i}: tell me about the number {i}."}],
        max_tokens=max_tokens, seed=1000 + i, temperature=1.0)
    m = r.choices[0].message
    return r.choices[0].finish_reason, m


async def run(url, model, n_clients, max_tokens, n_replay):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    started = asyncio.Event()
    tasks = [asyncio.create_task(one_client(client, model, i, max_tokens, started)) for i in range(n_clients)]
    t0 = time.perf_counter()
    started.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise SystemExit(f"{len(errors)} of {n_clients} clients failed; first: {errors[0]!r}")
    all_ids = set()
    for r in results:
        assert len(r["ids"]) == 1, f"client {r['i']}: chunks from several responses {r['ids']}"
        assert not (r["ids"] & all_ids), f"client {r['i']}: response id shared with another client"
        all_ids |= r["ids"]
        assert r["finish"] in ("stop", "length"), f"client {r['i']}: finish_reason {r['finish']}"
        assert r["usage"] is not None and 1 <= r["usage"].completion_tokens <= max_tokens, f"client {r['i']}: usage"
    tokens = sum(r["usage"].completion_tokens for r in results)
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    e2es = sorted(r["e2e"] for r in results)
    pct = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")  # noqa: E731
    print(f"{n_clients} concurrent streams: {wall:.2f} s, {tokens} tokens ({tokens / wall:.1f} tokens/s); "
          f"TTFT p50 {pct(ttfts, .5):.3f} s p99 {pct(ttfts, .99):.3f} s; e2e p50 {pct(e2es, .5):.3f} s "
          f"p99 {pct(e2es, .99):.3f} s")
    # The same prompt and seed, alone and not streamed, must give the same text.
    step = max(1, n_clients // n_replay)
    for r in results[::step]:
        finish, m = await replay(client, model, r["i"], max_tokens)
        whole = (getattr(m, "reasoning_content", None) or "", m.content or "")
        streamed = (r["reasoning"], r["content"])
        assert streamed == whole, f"client {r['i']}: streamed {streamed!r} != replay {whole!r}"
        assert finish == r["finish"], f"client {r['i']}: finish {r['finish']} != replay {finish}"
    print(f"replayed {len(results[::step])} requests: identical text and finish reasons")
    await client.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--osprey")
    p.add_argument("--build-dir")
    p.add_argument("--shared-dir")
    p.add_argument("--url")
    p.add_argument("--model", default="osprey-tiny")
    p.add_argument("--clients", type=int, default=int(os.environ.get("OSPREY_LOAD_CLIENTS", "200")))
    p.add_argument("--max-tokens", type=int, default=int(os.environ.get("OSPREY_LOAD_MAX_TOKENS", "4")))
    p.add_argument("--replay", type=int, default=10, help="how many clients to check against a replay")
    a = p.parse_args()
    if a.url:
        asyncio.run(run(a.url, a.model, a.clients, a.max_tokens, a.replay))
        return
    with OspreyServer(a.osprey, ["--served-model-name", a.model, "--max-model-len", "1024"],
                      env=test_env(a.build_dir, a.shared_dir)) as server:
        asyncio.run(run(server.url, a.model, a.clients, a.max_tokens, a.replay))


if __name__ == "__main__":
    main()
