"""The API surface vLLM users rely on (issue 15), against `osprey serve`: CORS preflights echo the
requested headers and --allowed-origins limits origins; X-Request-Id / request_id are echoed; vLLM's
extras (min_tokens, stop_token_ids, skip_special_tokens, include_stop_str_in_output,
chat_template_kwargs, priority) are honoured; /tokenize and /detokenize; prompt scoring (completions
echo + logprobs, as lm-evaluation-harness's local-completions sends it, and prompt_logprobs);
/v1/responses include, logprobs, an incomplete message item and input_items; several served names;
a call to an undeclared function is content; graceful shutdown; a port in use is reported before the
model loads; `osprey --help` on stdout.

    python tools/server/test_vllm_api.py --osprey build/osprey --build-dir build --shared-dir ../shared
"""
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import OspreyServer, test_env, run_unittests  # noqa: E402

ARGS = None
NAMES = ["osprey-a", "osprey-b"]


def request(url, method, path, body=None, headers=None, timeout=60):
    """(status, headers dict (lower-case names), parsed JSON or text)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read().decode("utf-8", "replace")
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    try:
        return r.status, hdrs, json.loads(data)
    except ValueError:
        return r.status, hdrs, data


class TinyModel(unittest.TestCase):
    """The built-in tiny model (random weights) on the CPU reference backend: prompt scoring works."""

    @classmethod
    def setUpClass(cls):
        cls.server = OspreyServer(ARGS.osprey, ["--served-model-name", *NAMES, "--max-model-len", "512",
                                                "--allowed-origins", '["http://good.example"]'],
                                  env=test_env(ARGS.build_dir, ARGS.shared_dir)).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_cors(self):
        status, h, _ = request(self.server.url, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://good.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-stainless-retry-count"})
        self.assertEqual(status, 204)
        self.assertEqual(h["access-control-allow-origin"], "http://good.example")
        self.assertEqual(h["access-control-allow-headers"],
                         "authorization, content-type, x-stainless-os, x-stainless-retry-count")
        self.assertIn("POST", h["access-control-allow-methods"])
        status, h, _ = request(self.server.url, "GET", "/v1/models", headers={"Origin": "http://good.example"})
        self.assertEqual(h["access-control-allow-origin"], "http://good.example")
        # Another origin gets no CORS headers (the browser then refuses to show the answer).
        status, h, _ = request(self.server.url, "OPTIONS", "/v1/models", headers={"Origin": "http://evil.example"})
        self.assertNotIn("access-control-allow-origin", h)

    def test_models_lists_every_name_and_accepts_each(self):
        self.assertEqual([m.id for m in self.client.models.list().data], NAMES)
        for name in NAMES:
            r = self.client.completions.create(model=name, prompt="Hi", max_tokens=1)
            self.assertEqual(r.model, NAMES[0])

    def test_request_id_header_and_field(self):
        status, h, body = request(self.server.url, "POST", "/v1/completions",
                                  {"model": NAMES[0], "prompt": "Hi", "max_tokens": 1},
                                  headers={"X-Request-Id": "trace-42"})
        self.assertEqual(status, 200)
        self.assertEqual(h["x-request-id"], "trace-42")
        self.assertEqual(body["id"], "cmpl-trace-42")
        status, h, body = request(self.server.url, "POST", "/v1/chat/completions",
                                  {"model": NAMES[0], "messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 2, "request_id": "mine-7"})
        self.assertEqual(status, 200)
        self.assertEqual(body["id"], "chatcmpl-mine-7")
        self.assertEqual(h["x-request-id"], "mine-7")
        # Streamed: the header is on the chunked head.
        status, h, _ = request(self.server.url, "POST", "/v1/chat/completions",
                               {"model": NAMES[0], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                "stream": True}, headers={"X-Request-Id": "s-1"})
        self.assertEqual(h["x-request-id"], "s-1")
        status, _, body = request(self.server.url, "GET", "/health", headers={"X-Request-Id": "bad\x7fid"})
        self.assertEqual(status, 400)

    def test_vllm_extras_are_accepted(self):
        extra = {"min_tokens": 3, "stop_token_ids": [200002], "skip_special_tokens": True,
                 "include_stop_str_in_output": False, "priority": -1, "chat_template_kwargs": {"reasoning_effort": "low"}}
        r = self.client.chat.completions.create(model=NAMES[0], messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, extra_body=extra)
        self.assertGreaterEqual(r.usage.completion_tokens, 3)
        extra.pop("chat_template_kwargs")
        r = self.client.completions.create(model=NAMES[0], prompt="Hello", max_tokens=4, extra_body=extra)
        self.assertGreaterEqual(r.usage.completion_tokens, 3)
        # Bad values name the field.
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=NAMES[0], prompt="Hi", max_tokens=2, extra_body={"min_tokens": 5})
        self.assertIn("min_tokens", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=NAMES[0], prompt="Hi", max_tokens=2,
                                           extra_body={"stop_token_ids": [10 ** 9]})
        self.assertIn("stop_token_ids[0]", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=NAMES[0], messages=[{"role": "user", "content": "Hi"}],
                                                extra_body={"chat_template_kwargs": {"reasoning_effort": "huge"}})
        self.assertIn("chat_template_kwargs.reasoning_effort", str(e.exception))

    def test_min_tokens_masks_the_stop_tokens(self):
        # The random model's first greedy token here is made a stop token: without min_tokens the
        # completion is empty, with it the stop token cannot be drawn for 4 tokens.
        first = self.client.completions.create(model=NAMES[0], prompt="Hello there", max_tokens=1, temperature=0,
                                               logprobs=1).choices[0].logprobs.tokens[0]
        ids = request(self.server.url, "POST", "/tokenize", {"prompt": first})[2]["tokens"]
        self.assertEqual(len(ids), 1)
        r = self.client.completions.create(model=NAMES[0], prompt="Hello there", max_tokens=8, temperature=0,
                                           extra_body={"stop_token_ids": ids})
        self.assertEqual(r.usage.completion_tokens, 1)
        r = self.client.completions.create(model=NAMES[0], prompt="Hello there", max_tokens=8, temperature=0,
                                           extra_body={"stop_token_ids": ids, "min_tokens": 4})
        self.assertGreaterEqual(r.usage.completion_tokens, 4)

    def test_tokenize_and_detokenize(self):
        status, _, t = request(self.server.url, "POST", "/tokenize", {"model": NAMES[1], "prompt": "Hello world"})
        self.assertEqual(status, 200)
        self.assertEqual(t["count"], len(t["tokens"]))
        self.assertEqual(t["max_model_len"], 512)
        status, _, d = request(self.server.url, "POST", "/detokenize", {"tokens": t["tokens"]})
        self.assertEqual(d["prompt"], "Hello world")
        messages = [{"role": "user", "content": "Hi"}]
        _, _, with_gen = request(self.server.url, "POST", "/tokenize", {"messages": messages})
        _, _, without = request(self.server.url, "POST", "/tokenize",
                                {"messages": messages, "add_generation_prompt": False})
        self.assertEqual(with_gen["count"], without["count"] + 2)  # <|start|>assistant
        # The chat route renders the same prompt: its usage counts those tokens.
        r = self.client.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=1)
        self.assertEqual(r.usage.prompt_tokens, with_gen["count"])
        for body, field in (({"tokens": [-1]}, "tokens[0]"), ({"prompt": "a", "messages": messages}, "prompt"),
                            ({}, "prompt"), ({"prompt": 3}, "prompt")):
            status, _, e = request(self.server.url, "POST", "/tokenize" if "tokens" not in body else "/detokenize", body)
            self.assertEqual(status, 400, body)
            self.assertIn(field, e["error"]["message"])

    def test_echo_with_logprobs_scores_the_prompt_like_lm_eval(self):
        # lm-evaluation-harness local-completions, loglikelihood: token-id prompts, echo, logprobs=1,
        # max_tokens=1; it sums token_logprobs[ctxlen:-1] and checks greediness against top_logprobs.
        ctx_ids = request(self.server.url, "POST", "/tokenize", {"prompt": "The capital of France is"})[2]["tokens"]
        cont_ids = request(self.server.url, "POST", "/tokenize", {"prompt": " Paris"})[2]["tokens"]
        prompts = [ctx_ids + cont_ids, ctx_ids]
        r = self.client.completions.create(model=NAMES[0], prompt=prompts, max_tokens=1, echo=True, logprobs=1,
                                           temperature=0, seed=1234)
        self.assertEqual(len(r.choices), 2)
        lp = r.choices[0].logprobs
        n = len(prompts[0])
        self.assertEqual(len(lp.token_logprobs), n + 1)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:]))
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(r.choices[0].text[:len("The capital of France is Paris")], "The capital of France is Paris")
        ll = sum(lp.token_logprobs[len(ctx_ids):-1])
        self.assertTrue(math.isfinite(ll))
        for tok, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
            self.assertLessEqual(tok, max(top.values()) + 1e-6)
        # The context's scores do not depend on what follows (the same prefix in the other prompt).
        other = r.choices[1].logprobs.token_logprobs
        for a, b in zip(lp.token_logprobs[1:len(ctx_ids)], other[1:len(ctx_ids)]):
            self.assertAlmostEqual(a, b, places=3)
        # vLLM's prompt_logprobs: [None, {id: {logprob, rank, decoded_token}}, ...], the prompt token included.
        status, _, body = request(self.server.url, "POST", "/v1/completions",
                                  {"model": NAMES[0], "prompt": prompts[0], "max_tokens": 1, "prompt_logprobs": 2})
        pl = body["choices"][0]["prompt_logprobs"]
        self.assertEqual(len(pl), n)
        self.assertIsNone(pl[0])
        for i in range(1, n):
            self.assertIn(str(prompts[0][i]), pl[i])
            self.assertAlmostEqual(pl[i][str(prompts[0][i])]["logprob"], lp.token_logprobs[i], places=3)
        # Streamed: the echo and the prompt's logprobs come first.
        chunks = list(self.client.completions.create(model=NAMES[0], prompt=prompts[1], max_tokens=2, echo=True,
                                                     logprobs=0, stream=True))
        self.assertEqual(len(chunks[0].choices[0].logprobs.tokens), len(ctx_ids) + 1)

    def test_text_offset_counts_characters(self):
        r = self.client.completions.create(model=NAMES[0], prompt="héllo wörld ✓ done", max_tokens=1, echo=True,
                                           logprobs=0, temperature=0)
        lp = r.choices[0].logprobs
        text = r.choices[0].text
        for tok, off in zip(lp.tokens, lp.text_offset):
            if "\ufffd" not in tok:
                self.assertEqual(text[off:off + len(tok)], tok)

    def test_responses_include_is_checked(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.responses.create(model=NAMES[0], input="Hi", include=["bogus.thing"], max_output_tokens=2)
        self.assertIn("include[0]", str(e.exception))
        self.client.responses.create(model=NAMES[0], input="Hi", include=["reasoning.encrypted_content"],
                                     max_output_tokens=2)


SCRIPT_FINAL = ("<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>"
                "One two three four five six seven eight nine ten.<|return|>")


class ScriptedFinal(unittest.TestCase):
    """The scripted backend writes a final answer: responses logprobs, a cut message, input_items."""

    @classmethod
    def setUpClass(cls):
        env = test_env(ARGS.build_dir, ARGS.shared_dir)
        env["OSPREY_TEST_SCRIPT"] = SCRIPT_FINAL
        cls.server = OspreyServer(ARGS.osprey, ["--served-model-name", NAMES[0]], env=env).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_responses_logprobs(self):
        r = self.client.responses.create(model=NAMES[0], input="Count.", include=["message.output_text.logprobs"],
                                         top_logprobs=1)
        part = [o for o in r.output if o.type == "message"][0].content[0]
        self.assertEqual(part.text, "One two three four five six seven eight nine ten.")
        self.assertGreater(len(part.logprobs), 5)
        self.assertEqual("".join(lp.token for lp in part.logprobs), part.text)
        # Streamed: the deltas carry them too.
        events = list(self.client.responses.create(model=NAMES[0], input="Count.", stream=True,
                                                   include=["message.output_text.logprobs"]))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        self.assertTrue(all(len(d.logprobs) >= 1 for d in deltas))

    def test_cut_message_item_is_incomplete(self):
        r = self.client.responses.create(model=NAMES[0], input="Count.", max_output_tokens=12)
        self.assertEqual(r.status, "incomplete")
        message = [o for o in r.output if o.type == "message"][0]
        self.assertEqual(message.status, "incomplete")
        self.assertEqual([o.status for o in r.output if o.type == "reasoning"], ["completed"])

    def test_input_items(self):
        r = self.client.responses.create(model=NAMES[0], input=[
            {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Count."}])
        items = self.client.responses.input_items.list(r.id)
        self.assertEqual([i.role for i in items.data], ["user", "developer"])  # newest first
        self.assertTrue(all(i.id for i in items.data))
        asc = self.client.responses.input_items.list(r.id, order="asc", limit=1)
        self.assertEqual(len(asc.data), 1)
        self.assertEqual(asc.data[0].role, "developer")
        self.assertTrue(asc.has_more)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.input_items.list("resp_nope")

    def test_prompt_scoring_needs_a_backend_that_scores(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=NAMES[0], prompt="Hi", max_tokens=1, echo=True, logprobs=1)
        self.assertIn("prompt scoring is not available", str(e.exception))


TOOL_SCRIPT = ("<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant to=functions.get_time"
               "<|channel|>commentary <|constrain|>json<|message|>{\"tz\": \"UTC\"}<|call|>")
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


class ScriptedUndeclaredCall(unittest.TestCase):
    """The model calls get_time: a call to a function the request did not declare is content."""

    @classmethod
    def setUpClass(cls):
        env = test_env(ARGS.build_dir, ARGS.shared_dir)
        env["OSPREY_TEST_SCRIPT"] = TOOL_SCRIPT
        cls.server = OspreyServer(ARGS.osprey, ["--served-model-name", NAMES[0]], env=env).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_undeclared_call_is_content(self):
        for tools in ([WEATHER_TOOL], None):
            kwargs = {"tools": tools} if tools else {}
            r = self.client.chat.completions.create(model=NAMES[0], messages=[{"role": "user", "content": "Time?"}],
                                                    **kwargs)
            c = r.choices[0]
            self.assertIsNone(c.message.tool_calls)
            self.assertEqual(c.message.content, "{\"tz\": \"UTC\"}")
            self.assertEqual(c.finish_reason, "stop")

    def test_include_stop_str_in_output(self):
        messages = [{"role": "user", "content": "Time?"}]
        r = self.client.chat.completions.create(model=NAMES[0], messages=messages, stop=["UTC"])
        self.assertEqual(r.choices[0].message.content, "{\"tz\": \"")
        r = self.client.chat.completions.create(model=NAMES[0], messages=messages, stop=["UTC"],
                                                extra_body={"include_stop_str_in_output": True})
        self.assertEqual(r.choices[0].message.content, "{\"tz\": \"UTC")


class Lifecycle(unittest.TestCase):
    """Start-up and shutdown."""

    def test_graceful_shutdown_ends_streams_with_an_error_event_and_done(self):
        server = OspreyServer(ARGS.osprey, ["--max-model-len", "4096", "--shutdown-timeout", "1"],
                              env=test_env(ARGS.build_dir, ARGS.shared_dir)).__enter__()
        try:
            u = urllib.parse.urlparse(server.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": "tiny", "prompt": "Hi", "max_tokens": 4000, "stream": True, "ignore_eos": True}))
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            first = r.readline()  # generation is under way
            self.assertTrue(first.startswith(b"data: "))
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            status, _, body = request(server.url, "GET", "/health")
            self.assertEqual(status, 503)
            self.assertEqual(body, {"status": "draining"})
            status, _, body = request(server.url, "POST", "/v1/completions",
                                      {"model": "tiny", "prompt": "Hi", "max_tokens": 2})
            self.assertEqual(status, 503)
            rest = r.read().decode()  # a complete chunked body: no IncompleteRead
            events = [line[6:] for line in rest.split("\n") if line.startswith("data: ")]
            self.assertEqual(events[-1], "[DONE]")
            self.assertEqual(json.loads(events[-2])["error"]["code"], "server_shutdown")
            self.assertEqual(server.proc.wait(timeout=20), 0)
        finally:
            server.stop()

    def test_port_in_use_is_reported_before_the_model_loads(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            env = dict(os.environ, **test_env(ARGS.build_dir, ARGS.shared_dir))
            started = time.time()
            p = subprocess.run([ARGS.osprey, "serve", "--port", str(port), "--model", "/nonexistent/model"],
                               capture_output=True, text=True, env=env, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("Address already in use", p.stderr)  # not the missing model
            self.assertLess(time.time() - started, 10)

    def test_help_goes_to_stdout(self):
        for args in (["--help"], ["serve", "--help"]):
            p = subprocess.run([ARGS.osprey, *args], capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0)
            self.assertIn("usage: osprey", p.stdout)
            self.assertEqual(p.stderr, "")


def main():
    run_unittests(globals())


if __name__ == "__main__":
    main()
