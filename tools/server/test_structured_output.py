"""Structured output through `osprey serve` with the official `openai` client: response_format
(json_schema, json_object), the responses API's text.format, vLLM's guided_* extras, strict tools and
forced tool calls. The oracle is the `jsonschema` package: every constrained output validates.

The tiny model has random weights, so whatever it picks inside the mask is arbitrary: a constrained
output that still validates is the point. Schemas keep every string and array bounded (maxLength,
maxItems, enums) so that outputs end well within max_tokens (a random model inside an unbounded string
almost never picks a closing quote among ~190k allowed tokens). Chat answers on a random model never
leave the analysis channel, so the chat and responses cases that need a final answer run on the
test-only scripted backend, whose refused script tokens are replaced by random allowed ones.

    python tools/server/test_structured_output.py --osprey build/osprey --build-dir build --shared-dir ../shared
"""
import json
import os
import re
import sys
import unittest

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_process  # noqa: E402
from server_process import OspreyServer, test_env, run_unittests  # noqa: E402

ARGS = None
MODEL = "osprey-tiny"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "role": {"enum": ["admin", "user", None, 3]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "address": {"$ref": "#/$defs/address"},
        "note": {"anyOf": [{"type": "null"}, {"const": "n/a"}]},
        "day": {"type": "string", "format": "date"},
    },
    "required": ["name", "role", "active", "address"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"enum": ["FR", "DE"]}},
            "required": ["zip", "country"],
        }
    },
}

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validate(test, text, schema):
    try:
        value = json.loads(text)
    except ValueError as e:
        test.fail(f"not JSON ({e}): {text!r}")
    try:
        jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError as e:
        test.fail(f"does not validate ({e.message}): {text!r}")
    return value


class TinyModel(unittest.TestCase):
    """The built-in tiny model (random weights) on the CPU reference backend."""

    @classmethod
    def setUpClass(cls):
        cls.server = OspreyServer(ARGS.osprey, ["--served-model-name", MODEL, "--max-model-len", "1024"],
                                  env=test_env(ARGS.build_dir, ARGS.shared_dir)).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_completions_json_schema_validates(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        for seed in (1, 2):
            r = self.client.completions.create(model=MODEL, prompt="Person:", max_tokens=300, seed=seed, n=2,
                                               temperature=1.0, extra_body={"response_format": fmt})
            for c in r.choices:
                self.assertEqual(c.finish_reason, "stop", c.text)
                validate(self, c.text, PERSON)

    def test_completions_greedy_and_streamed(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
        r = self.client.completions.create(model=MODEL, prompt="Weather:", max_tokens=100, temperature=0,
                                           extra_body={"response_format": fmt})
        validate(self, r.choices[0].text, WEATHER)
        text = ""
        for chunk in self.client.completions.create(model=MODEL, prompt="Weather:", max_tokens=100, temperature=0,
                                                    stream=True, extra_body={"response_format": fmt}):
            if chunk.choices:
                text += chunk.choices[0].text
        self.assertEqual(text, r.choices[0].text)

    def test_vllm_guided_extras(self):
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=40, seed=3,
                                           extra_body={"guided_regex": "[a-c]{2,4}-[0-9]{3}"})
        self.assertRegex(r.choices[0].text, r"^[a-c]{2,4}-[0-9]{3}$")
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=40, seed=4,
                                           extra_body={"guided_choice": ["yes", "no", "maybe so"]})
        self.assertIn(r.choices[0].text, ["yes", "no", "maybe so"])
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=60, seed=5, extra_body={
            "guided_grammar": 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [1-9] [0-9]?'})
        self.assertRegex(r.choices[0].text, r"^\([1-9][0-9]?(\+[1-9][0-9]?){0,3}\)$")
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=100, seed=6,
                                           extra_body={"guided_json": json.dumps(WEATHER)})
        validate(self, r.choices[0].text, WEATHER)
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=100, seed=7,
                                           extra_body={"structured_outputs": {"choice": ["left", "right"]}})
        self.assertIn(r.choices[0].text, ["left", "right"])

    def test_forced_named_call_follows_its_schema(self):
        # get_time is not strict: forcing it still constrains its arguments.
        for name in ("get_weather", "get_time"):
            r = self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=100, seed=8,
                tool_choice={"type": "function", "function": {"name": name}})
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls", c.message)
            self.assertEqual(c.message.tool_calls[0].function.name, name)
            validate(self, c.message.tool_calls[0].function.arguments, TOOL_SCHEMAS[name])

    def test_required_call_picks_a_declared_function(self):
        names = set()
        for seed in range(4):
            r = self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=100, seed=seed,
                tool_choice="required")
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls", c.message)
            call = c.message.tool_calls[0].function
            self.assertIn(call.name, TOOL_SCHEMAS)
            validate(self, call.arguments, TOOL_SCHEMAS[call.name])
            names.add(call.name)

    def test_responses_forced_call(self):
        tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
        r = self.client.responses.create(model=MODEL, input="hi", tools=tools, tool_choice="required",
                                         max_output_tokens=100)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1, r.output)
        validate(self, calls[0].arguments, WEATHER)

    def test_unsupported_schema_is_a_400_naming_the_keyword(self):
        bad = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}],
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
        body = e.exception.body
        self.assertIn("unsupported JSON Schema keyword 'minimum' at #/properties/age", body["message"])
        self.assertEqual(body["param"], "response_format.json_schema.schema")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=MODEL, prompt="x", extra_body={"guided_regex": "(a)\\1"})
        self.assertIn("backreferences are not supported", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": {"name": "f", "strict": True, "parameters": bad}}])
        self.assertIn("tools[0].parameters", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=MODEL, prompt="x",
                                           extra_body={"guided_regex": "a", "guided_choice": ["a"]})
        self.assertIn("give one structured-output constraint", e.exception.body["message"])


# Analysis, then a final message whose content is a compact JSON object, then <|return|>.
FINAL_SCRIPT = ("<|channel|>analysis<|message|>Thinking.<|end|><|start|>assistant<|channel|>final<|message|>"
                '{"ok":true}<|return|>')
# The same model calling get_weather without tool_choice (strict arguments: the script's own
# arguments lack the required "unit", so the constraint takes over at its closing brace).
CALL_SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
               "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")


class ScriptedServer(server_process.ScriptedServerCase):
    MODEL = MODEL


class ScriptedFinalAnswer(ScriptedServer):
    SCRIPT = FINAL_SCRIPT
    MESSAGES = [{"role": "user", "content": "Describe someone."}]

    def test_unconstrained_and_json_object_keep_the_script(self):
        r = self.client.chat.completions.create(model=MODEL, messages=self.MESSAGES)
        self.assertEqual(r.choices[0].message.content, '{"ok":true}')
        r = self.client.chat.completions.create(model=MODEL, messages=self.MESSAGES,
                                                response_format={"type": "json_object"})
        self.assertEqual(r.choices[0].message.content, '{"ok":true}')
        self.assertEqual(r.choices[0].message.reasoning_content, "Thinking.")  # analysis stays free

    def test_json_schema_final_channel(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        for seed in (1, 2, 3):
            r = self.client.chat.completions.create(model=MODEL, messages=self.MESSAGES, response_format=fmt,
                                                    seed=seed, max_tokens=400)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "stop")
            self.assertEqual(c.message.reasoning_content, "Thinking.")
            validate(self, c.message.content, PERSON)

    def test_streamed_json_schema(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
        content = ""
        for chunk in self.client.chat.completions.create(model=MODEL, messages=self.MESSAGES, response_format=fmt,
                                                         stream=True, seed=9, max_tokens=200):
            if chunk.choices and chunk.choices[0].delta.content:
                content += chunk.choices[0].delta.content
        validate(self, content, WEATHER)

    def test_responses_text_format(self):
        fmt = {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}
        r = self.client.responses.create(model=MODEL, input="Weather?", text={"format": fmt}, max_output_tokens=200)
        validate(self, r.output_text, WEATHER)
        self.assertEqual(r.text.format.type, "json_schema")
        parsed = self.client.responses.create(model=MODEL, input="x", text={"format": {"type": "json_object"}})
        self.assertEqual(json.loads(parsed.output_text), {"ok": True})


class ScriptedStrictCall(ScriptedServer):
    SCRIPT = CALL_SCRIPT

    def test_strict_arguments_are_enforced(self):
        for seed in (1, 2):
            r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Paris?"}],
                                                    tools=TOOLS, seed=seed, max_tokens=200)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls")
            self.assertEqual(c.message.reasoning_content, "Need the weather.")
            call = c.message.tool_calls[0].function
            self.assertEqual(call.name, "get_weather")
            self.assertTrue(call.arguments.startswith('{"city": "Paris'), call.arguments)  # the script's own start
            validate(self, call.arguments, WEATHER)

    def test_non_strict_arguments_stay_free(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Paris?"}],
                                                tools=tools)
        self.assertEqual(r.choices[0].message.tool_calls[0].function.arguments, '{"city": "Paris"}')


def main():
    run_unittests(globals())


if __name__ == "__main__":
    main()
