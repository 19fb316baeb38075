"""A real agent client end to end: the OpenAI Agents SDK runs a tool-using loop against `osprey serve`
on the scripted test backend, through chat completions and through responses (issue 15). The backend
plays two turns ($OSPREY_TEST_SCRIPT with '<<next turn>>'): a call to get_weather, then, once the
prompt holds that call and its result, a final answer. Tracing is off (no network).

    python tools/server/test_agents_sdk.py --osprey build/osprey --build-dir build --shared-dir ../shared
"""
import os
import sys
import unittest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import agents  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import OspreyServer, test_env, run_unittests  # noqa: E402

ARGS = None
MODEL = "osprey-agent"
SCRIPT = ("<|channel|>analysis<|message|>I should look up the weather.<|end|>"
          "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
          "<|message|>{\"city\": \"Paris\"}<|call|>"
          "<<next turn>>"
          "<|channel|>analysis<|message|>The tool answered.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris, 21 C.<|return|>")


class AgentsSdk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        agents.set_tracing_disabled(True)
        env = test_env(ARGS.build_dir, ARGS.shared_dir)
        env["OSPREY_TEST_SCRIPT"] = SCRIPT
        cls.server = OspreyServer(ARGS.osprey, ["--served-model-name", MODEL], env=env).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def run_agent(self, model_class):
        calls = []

        @agents.function_tool
        def get_weather(city: str) -> str:
            """Current weather in a city."""
            calls.append(city)
            return f"Sunny in {city}, 21 C"

        client = AsyncOpenAI(base_url=self.server.url + "/v1", api_key="unused", max_retries=0)
        agent = agents.Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                             model=model_class(model=MODEL, openai_client=client))
        result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
        return result, calls

    def check(self, result, calls):
        self.assertEqual(calls, ["Paris"])
        self.assertEqual(result.final_output, "It is sunny in Paris, 21 C.")
        kinds = [item.type for item in result.new_items]
        self.assertIn("tool_call_item", kinds)
        self.assertIn("tool_call_output_item", kinds)
        self.assertEqual(kinds[-1], "message_output_item")

    def test_chat_completions_loop(self):
        self.check(*self.run_agent(agents.OpenAIChatCompletionsModel))

    def test_responses_loop(self):
        self.check(*self.run_agent(agents.OpenAIResponsesModel))


def main():
    run_unittests(globals())


if __name__ == "__main__":
    main()
