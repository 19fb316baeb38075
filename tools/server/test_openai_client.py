"""Drives `osprey serve` with the official `openai` Python client: every endpoint, streaming and not,
tool calls (through the test-only scripted backend), the rendering of tool history (checked token for
token against openai-harmony when it is installed), validation errors, auth, metrics, cancellation.

    python tools/server/test_openai_client.py --osprey build/osprey --build-dir build --shared-dir ../shared
"""
import datetime
import http.client
import json
import os
import socket
import sys
import time
import unittest
import urllib.parse

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_process  # noqa: E402
from server_process import OspreyServer, test_env, run_unittests  # noqa: E402

ARGS = None
KEY = "test-key-123"
MODEL = "osprey-tiny"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

TOOL_SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
               "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")
# A call whose arguments stop being JSON part-way ("Par" then a stray brace): streamed, it is announced,
# its viable prefix arrives as deltas, then it is closed incomplete and its text follows as a message.
CUT_CALL_SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
                   "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Par}}<|call|>")


def raw_request(url, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) of one HTTP request, with a body given as bytes or str."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    if isinstance(body, str):
        body = body.encode()
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read().decode("utf-8", "replace")
    conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class TinyModel(unittest.TestCase):
    """The built-in tiny model (random weights) on the CPU reference backend."""

    @classmethod
    def setUpClass(cls):
        cls.server = OspreyServer(ARGS.osprey, ["--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", "512",
                                                "--max-body-bytes", "65536"],
                                  env=test_env(ARGS.build_dir, ARGS.shared_dir)).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def auth(self):
        return {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])
        self.assertEqual(self.client.models.retrieve(MODEL).id, MODEL)

    def test_chat(self):
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                                max_tokens=8, seed=7)
        c = r.choices[0]
        self.assertEqual(c.message.role, "assistant")
        self.assertIn(c.finish_reason, ("stop", "length"))
        self.assertLessEqual(r.usage.completion_tokens, 8)
        self.assertGreater(r.usage.prompt_tokens, 20)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_chat_stream_matches_non_stream(self):
        kwargs = dict(model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Count to three"}],
                      max_completion_tokens=12, temperature=0.8, seed=1234)
        whole = self.client.chat.completions.create(**kwargs)
        stream = self.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
        content, reasoning, finish, usage, ids = "", "", None, None, set()
        for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                finish = choice.finish_reason or finish
        self.assertEqual(len(ids), 1)
        m = whole.choices[0].message
        self.assertEqual(content, m.content or "")
        self.assertEqual(reasoning, getattr(m, "reasoning_content", None) or "")
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_chat_n_logprobs_and_effort(self):
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                                max_tokens=4, logprobs=True, top_logprobs=3, seed=5,
                                                reasoning_effort="high")
        self.assertEqual(len(r.choices), 2)
        for c in r.choices:
            self.assertGreaterEqual(len(c.logprobs.content), 1)
            self.assertEqual(len(c.logprobs.content[0].top_logprobs), 3)
            self.assertLessEqual(c.logprobs.content[0].logprob, 0.0)
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                                extra_body={"reasoning": {"effort": "low"}, "top_k": 5, "min_p": 0.1})
        self.assertEqual(len(r.choices), 1)

    def test_seed_reproducible(self):
        kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Seeded"}], max_tokens=6, seed=99)
        a = self.client.chat.completions.create(**kwargs).choices[0].message.content
        b = self.client.chat.completions.create(**kwargs).choices[0].message.content
        self.assertEqual(a, b)

    def test_tool_history_is_accepted_and_rendered(self):
        messages = [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 20}"},
        ]
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=3)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        expected = harmony_prompt_tokens(messages)
        if expected is not None:
            self.assertEqual(r.usage.prompt_tokens, expected, "prompt differs from openai-harmony's rendering")
        # The tool turn adds tokens: without it the prompt is shorter.
        r2 = self.client.chat.completions.create(model=MODEL, messages=messages[:2], tools=[WEATHER_TOOL], max_tokens=1)
        self.assertLess(r2.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_completions(self):
        r = self.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
        self.assertEqual(len(r.choices), 1)
        self.assertLessEqual(r.usage.completion_tokens, 5)
        r = self.client.completions.create(model=MODEL, prompt=[1, 2, 3, 4], max_tokens=3, logprobs=2, seed=3)
        self.assertEqual(r.usage.prompt_tokens, 4)
        self.assertEqual(len(r.choices[0].logprobs.tokens), r.usage.completion_tokens)
        r = self.client.completions.create(model=MODEL, prompt=["a b", "c d"], max_tokens=2, n=2, seed=1)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2, 3])
        r = self.client.completions.create(model=MODEL, prompt="Echo me", max_tokens=2, echo=True, seed=1)
        self.assertTrue(r.choices[0].text.startswith("Echo me"))
        text, finish = "", None
        for chunk in self.client.completions.create(model=MODEL, prompt="Stream", max_tokens=6, stream=True,
                                                    extra_body={"ignore_eos": True}, seed=2):
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
        self.assertEqual(finish, "length")

    def test_responses(self):
        r = self.client.responses.create(model=MODEL, input="Hello", max_output_tokens=6, instructions="Be terse.")
        self.assertEqual(r.object, "response")
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertLessEqual(r.usage.output_tokens, 6)
        got = self.client.responses.retrieve(r.id)
        self.assertEqual(got.id, r.id)
        # Continue the stored conversation: the prompt grows by the earlier turn.
        r2 = self.client.responses.create(model=MODEL, input="And again?", previous_response_id=r.id,
                                          max_output_tokens=4, reasoning={"effort": "low"})
        self.assertGreater(r2.usage.input_tokens, r.usage.input_tokens)
        self.assertEqual(r2.previous_response_id, r.id)
        types = []
        final = None
        for event in self.client.responses.create(model=MODEL, input=[{"role": "user", "content": "Stream"}],
                                                  max_output_tokens=5, stream=True):
            types.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        self.assertEqual(types[0], "response.created")
        self.assertIn(types[-1], ("response.completed", "response.incomplete"))
        self.assertIsNotNone(final)
        deleted = self.client.responses.delete(r.id)
        self.assertIsNone(deleted)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.create(model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=1)

    def test_errors(self):
        url = self.server.url
        h = self.auth()
        cases = [
            ("bad JSON", "POST", "/v1/chat/completions", b"{\"model\": ", 400, None),
            ("invalid UTF-8", "POST", "/v1/chat/completions",
             b"{\"model\": \"osprey-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", 400, None),
            ("wrong type", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), 400,
             "temperature"),
            ("out of range", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}), 400, "top_p"),
            ("n too big", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 1000}), 400, "n"),
            ("bad message", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}), 400, "messages[0].content"),
            ("bad role", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "bot", "content": "x"}]}), 400, "messages[0].role"),
            ("no messages", "POST", "/v1/chat/completions", json.dumps({"model": MODEL}), 400, "messages"),
            ("unknown parameter", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}), 400,
             "frobnicate"),
            ("unknown model", "POST", "/v1/chat/completions",
             json.dumps({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}), 404, "model"),
            ("too long prompt", "POST", "/v1/completions",
             json.dumps({"model": MODEL, "prompt": list(range(600)), "max_tokens": 1}), 400, "prompt"),
            ("max_tokens past the context", "POST", "/v1/completions",
             json.dumps({"model": MODEL, "prompt": [1, 2], "max_tokens": 100000}), 400, "max_tokens"),
            ("token id outside vocabulary", "POST", "/v1/completions",
             json.dumps({"model": MODEL, "prompt": [1, 999999999], "max_tokens": 1}), 400, "prompt[1]"),
            ("oversized body", "POST", "/v1/chat/completions", b"{\"x\": \"" + b"a" * 70000 + b"\"}", 413, None),
            ("wrong method", "GET", "/v1/chat/completions", None, 405, None),
            ("unknown route", "GET", "/v1/nothing", None, 404, None),
            ("bad tool", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]}),
             400, "tools[0].type"),
            ("tool result for an unknown call", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}), 400,
             "messages[0].tool_call_id"),
            ("bad effort", "POST", "/v1/chat/completions",
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"}),
             400, "reasoning_effort"),
            ("responses: bad input", "POST", "/v1/responses", json.dumps({"model": MODEL, "input": 3}), 400, "input"),
        ]
        for name, method, path, body, status, param in cases:
            with self.subTest(name):
                got, data = raw_request(url, method, path, body, h)
                self.assertEqual(got, status, f"{name}: {data}")
                self.assertIsInstance(data, dict, name)
                err = data["error"]
                self.assertTrue(err["message"], name)
                self.assertIn("type", err)
                if param is not None:
                    self.assertEqual(err["param"], param, f"{name}: {err}")
        # Auth: every /v1 route needs the key; /health does not.
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}):
            got, data = raw_request(url, "GET", "/v1/models", None, headers)
            self.assertEqual(got, 401)
            self.assertEqual(data["error"]["type"], "authentication_error")
        self.assertEqual(raw_request(url, "GET", "/health")[0], 200)
        bad = openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        # A malformed request line and an oversized header block get 4xx too.
        s = socket.create_connection((urllib.parse.urlparse(url).hostname, urllib.parse.urlparse(url).port))
        s.sendall(b"NONSENSE\r\n\r\n")
        self.assertIn(b" 400 ", s.recv(4096))
        s.close()

    def test_disconnect_cancels(self):
        u = urllib.parse.urlparse(self.server.url)
        before = metric(raw_request(self.server.url, "GET", "/metrics")[1], "osprey_engine_generated_tokens_total")
        body = json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 500, "stream": True, "ignore_eos": True})
        s = socket.create_connection((u.hostname, u.port))
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        self.assertIn(b"200 OK", s.recv(4096))
        s.close()
        deadline = time.time() + 20
        running = None
        while time.time() < deadline:
            _, text = raw_request(self.server.url, "GET", "/metrics")
            running = metric(text, "osprey_num_requests_running")
            if running == 0 and metric(text, "osprey_num_requests_waiting") == 0:
                break
            time.sleep(0.05)
        self.assertEqual(running, 0)
        self.assertIn('finished_reason="abort"', text)
        # Cancelled long before its 500 tokens (other tests may run nothing meanwhile: one class, in order).
        self.assertLess(metric(text, "osprey_engine_generated_tokens_total") - before, 250)

    def test_metrics(self):
        self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "m"}], max_tokens=3)
        status, text = raw_request(self.server.url, "GET", "/metrics")
        self.assertEqual(status, 200)
        for name in ("osprey_time_to_first_token_seconds_count", "osprey_inter_token_latency_seconds_count",
                     "osprey_e2e_request_latency_seconds_count", "osprey_prompt_tokens_total",
                     "osprey_generation_tokens_total", "osprey_kv_cache_usage_perc", "osprey_prefix_cache_hit_rate",
                     "osprey_num_requests_running", "osprey_num_requests_waiting"):
            self.assertIsNotNone(metric(text, name), name)
        self.assertGreater(metric(text, "osprey_generation_tokens_total"), 0)
        self.assertIn('osprey_http_requests_total{route="/v1/chat/completions",status="200"}', text)


class ScriptedServer(server_process.ScriptedServerCase):
    """A server on the test-only scripted backend ($OSPREY_TEST_SCRIPT): every request generates SCRIPT."""
    MODEL = MODEL


class ScriptedToolCalls(ScriptedServer):
    """The scripted backend generates a Harmony tool call."""
    SCRIPT = TOOL_SCRIPT

    def test_tool_call_round_trip(self):
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(c.message.reasoning_content, "Need the weather.")
        self.assertEqual(len(c.message.tool_calls), 1)
        call = c.message.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Paris"})
        self.assertGreater(r.usage.completion_tokens_details.reasoning_tokens, 0)
        # Streamed: the same call arrives as deltas.
        name, args, reasoning, finish = "", "", "", None
        for chunk in self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                         stream=True):
            for ch in chunk.choices:
                reasoning += getattr(ch.delta, "reasoning_content", None) or ""
                for tc in ch.delta.tool_calls or []:
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
                finish = ch.finish_reason or finish
        self.assertEqual((name, json.loads(args), reasoning, finish),
                         ("get_weather", {"city": "Paris"}, "Need the weather.", "tool_calls"))
        # The arguments are streamed in pieces, OpenAI style (the first delta names the call with
        # arguments "", the next ones carry only arguments), and the openai client's own accumulator
        # rebuilds exactly the non-streaming call.
        from openai.lib.streaming.chat import ChatCompletionStreamState
        state = ChatCompletionStreamState(input_tools=[WEATHER_TOOL])
        pieces = []
        for chunk in self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                         stream=True):
            state.handle_chunk(chunk)
            for ch in chunk.choices:
                pieces += ch.delta.tool_calls or []
        self.assertGreater(len(pieces), 3)
        self.assertEqual((pieces[0].index, pieces[0].type, pieces[0].function.name, pieces[0].function.arguments),
                         (0, "function", "get_weather", ""))
        self.assertTrue(pieces[0].id.startswith("call_"))
        for p in pieces[1:]:
            self.assertEqual((p.index, p.id, p.function.name), (0, None, None))
            self.assertTrue(p.function.arguments)
        final = state.get_final_completion().choices[0]
        self.assertEqual(final.finish_reason, "tool_calls")
        self.assertEqual(len(final.message.tool_calls), 1)
        streamed = final.message.tool_calls[0]
        self.assertEqual((streamed.type, streamed.function.name, streamed.function.arguments),
                         (call.type, call.function.name, call.function.arguments))
        self.assertEqual(json.loads(streamed.function.arguments), {"city": "Paris"})
        # Send the call and its result back: accepted, and the prompt grows.
        messages2 = messages + [c.message.model_dump(exclude_none=True),
                                {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 20}"}]
        r2 = self.client.chat.completions.create(model=MODEL, messages=messages2, tools=[WEATHER_TOOL])
        self.assertEqual(r2.choices[0].finish_reason, "tool_calls")
        self.assertGreater(r2.usage.prompt_tokens, r.usage.prompt_tokens)
        # tool_choice "none": the call is not reported as a tool call.
        r3 = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                 tool_choice="none")
        self.assertIsNone(r3.choices[0].message.tool_calls)
        self.assertNotEqual(r3.choices[0].finish_reason, "tool_calls")

    def test_responses_function_call(self):
        tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
        r = self.client.responses.create(model=MODEL, input="Weather in Paris?", tools=[tool])
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].name, "get_weather")
        self.assertEqual(json.loads(calls[0].arguments), {"city": "Paris"})
        self.assertEqual([o.type for o in r.output], ["reasoning", "function_call"])
        r2 = self.client.responses.create(model=MODEL, previous_response_id=r.id, tools=[tool],
                                          input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                  "output": "{\"temp\": 20}"}])
        self.assertGreater(r2.usage.input_tokens, r.usage.input_tokens)
        events = list(self.client.responses.create(model=MODEL, input="again", tools=[tool], stream=True))
        types = [e.type for e in events]
        self.assertIn("response.reasoning_text.delta", types)
        self.assertEqual(types[-1], "response.completed")
        # The call is announced with its name and id, its arguments arrive in several deltas (as the
        # tokens come), and the pieces, the done event and the final output agree.
        added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
        self.assertEqual(len(added), 1)
        self.assertEqual((added[0].name, added[0].arguments, added[0].status), ("get_weather", "", "in_progress"))
        self.assertTrue(added[0].call_id.startswith("call_"))
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        self.assertGreater(len(deltas), 3)
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        self.assertEqual(len(done), 1)
        self.assertEqual("".join(deltas), done[0].arguments)
        self.assertEqual(json.loads(done[0].arguments), {"city": "Paris"})
        final = [o for o in events[-1].response.output if o.type == "function_call"]
        self.assertEqual((final[0].call_id, final[0].arguments, final[0].status),
                         (added[0].call_id, done[0].arguments, "completed"))


class ScriptedCutCall(ScriptedServer):
    """A generated call whose arguments are not JSON is never reported as a complete call."""
    SCRIPT = CUT_CALL_SCRIPT

    def test_cut_call(self):
        tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
        text = '{"city": "Par}}'
        # Chat: no tool call, the call's text is the content.
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                                tools=[WEATHER_TOOL])
        self.assertIsNone(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].message.content, text)
        self.assertNotEqual(r.choices[0].finish_reason, "tool_calls")
        # Responses, not streamed: only a reasoning item and a message.
        r = self.client.responses.create(model=MODEL, input="Weather?", tools=[tool])
        self.assertEqual([o.type for o in r.output], ["reasoning", "message"])
        self.assertEqual(r.output[1].content[0].text, text)
        # Streamed: the announced call ends "incomplete" without an arguments.done, then the message.
        events = list(self.client.responses.create(model=MODEL, input="Weather?", tools=[tool], stream=True))
        types = [e.type for e in events]
        self.assertNotIn("response.function_call_arguments.done", types)
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        self.assertTrue(text.startswith(deltas) and deltas, deltas)
        done = [e.item for e in events if e.type == "response.output_item.done"]
        self.assertEqual([(o.type, o.status) for o in done],
                         [("reasoning", "completed"), ("function_call", "incomplete"), ("message", "completed")])
        self.assertEqual(done[2].content[0].text, text)
        final = events[-1].response
        self.assertEqual([(o.type, o.status) for o in final.output], [(o.type, o.status) for o in done])


class ScriptedForcedNamedCall(ScriptedServer):
    """tool_choice naming a function: the prompt ends with that call's header, so the (scripted) model
    only writes the arguments and the call is reported under that name."""
    SCRIPT = "{\"city\": \"Paris\"}<|call|>"

    def test_named_tool_choice(self):
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice=named)
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(len(c.message.tool_calls), 1)
        self.assertEqual(c.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(c.message.tool_calls[0].function.arguments), {"city": "Paris"})
        self.assertGreater(r.usage.completion_tokens, 0)
        # The header is part of the prompt: more prompt tokens than with tool_choice "auto".
        auto = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
        self.assertGreater(r.usage.prompt_tokens, auto.usage.prompt_tokens)
        # Streamed: the first tool-call delta names the call (sent with the first generated token).
        name, args = "", ""
        for chunk in self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                         tool_choice=named, stream=True):
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
        self.assertEqual((name, json.loads(args)), ("get_weather", {"city": "Paris"}))
        # The Responses API forces the same way.
        tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
        resp = self.client.responses.create(model=MODEL, input="Weather?", tools=[tool],
                                            tool_choice={"type": "function", "name": "get_weather"})
        self.assertEqual([o.type for o in resp.output], ["function_call"])
        self.assertEqual(json.loads(resp.output[0].arguments), {"city": "Paris"})
        # A named function that is not among the tools is a 400.
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                tool_choice={"type": "function", "function": {"name": "nope"}})


class ScriptedForcedAnyCall(ScriptedServer):
    """tool_choice "required": the prompt ends at `to=functions.` and the model names the function."""
    SCRIPT = "get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>"

    def test_required_tool_choice(self):
        messages = [{"role": "user", "content": "Weather in Oslo?"}]
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                tool_choice="required")
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(c.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(c.message.tool_calls[0].function.arguments), {"city": "Oslo"})
        # "required" without tools is a 400 naming tool_choice.
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=MODEL, messages=messages, tool_choice="required")
        self.assertIn("tool_choice", str(cm.exception))


def harmony_prompt_tokens(messages):
    """Token count of the prompt openai-harmony renders for TinyModel.test_tool_history_is_accepted_and_rendered's
    conversation, or None when openai-harmony is not installed."""
    try:
        from openai_harmony import (Author, Conversation, DeveloperContent, HarmonyEncodingName, Message, ReasoningEffort,
                                    Role, SystemContent, ToolDescription, load_harmony_encoding)
    except ImportError:
        return None
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", os.path.join(ARGS.shared_dir, "data"))
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    fn = WEATHER_TOOL["function"]
    conv = Conversation.from_messages([
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort.MEDIUM)
                                      .with_conversation_start_date(today)),
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(messages[0]["content"])
                                      .with_function_tools([ToolDescription.new(fn["name"], fn["description"],
                                                                                parameters=fn["parameters"])])),
        Message.from_role_and_content(Role.USER, messages[1]["content"]),
        Message.from_role_and_content(Role.ASSISTANT, "Need the tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, messages[2]["tool_calls"][0]["function"]["arguments"])
        .with_channel("commentary").with_recipient("functions.get_weather").with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), messages[3]["content"])
        .with_recipient("assistant").with_channel("commentary"),
    ])
    return len(enc.render_conversation_for_completion(conv, Role.ASSISTANT))


def main():
    run_unittests(globals())


if __name__ == "__main__":
    main()
