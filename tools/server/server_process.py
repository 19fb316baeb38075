"""Starts `osprey serve` on a free port for the Python tests and stops it again (stdlib only).

    with OspreyServer(osprey_binary, extra_args=["--api-key", "k"], env={...}) as server:
        server.url  # "http://127.0.0.1:PORT"
"""
import argparse
import os
import re
import ssl
import subprocess
import threading
import sys
import time
import unittest
import urllib.request


class OspreyServer:
    def __init__(self, binary, extra_args=(), env=None, startup_timeout=120):
        self.binary = binary
        self.extra_args = list(extra_args)
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.startup_timeout = startup_timeout
        self.proc = None
        self.url = None
        self.output = []

    def __enter__(self):
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--port", "0", *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        found = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.output.append(line)
                m = re.search(r"listening on (https?://\S+)", line)
                if m and not found.is_set():
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.time() + self.startup_timeout
        while not found.wait(0.1):
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("osprey serve did not start:\n" + "".join(self.output))
        if self.url is None:
            raise RuntimeError("osprey serve exited:\n" + "".join(self.output))
        # A test's https server has a certificate of its own: the start-up check does not verify it.
        context = ssl._create_unverified_context() if self.url.startswith("https") else None
        with urllib.request.urlopen(self.url + "/health", timeout=10, context=context) as r:
            assert r.status == 200
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc):
        self.stop()
        return False


def test_env(build_dir, shared_dir):
    """Environment for a server on the built-in tiny model: a cache folder in the build tree and the
    tokenizer from shared/."""
    return {
        "OSPREY_CACHE": os.path.join(build_dir, "osprey-cache"),
        "OSPREY_TIKTOKEN_FILE": os.path.join(shared_dir, "data", "o200k_base.tiktoken"),
        "OSPREY_LOG": "warn",
    }


_ARGS = None  # the unittest scripts' common flags (run_unittests)


def run_unittests(module_globals):
    """The unittest scripts' entry point: parses their common flags (--osprey, --build-dir,
    --shared-dir) into the module's ARGS and runs unittest.main on the remaining arguments."""
    global _ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--osprey", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--shared-dir", required=True)
    _ARGS, rest = p.parse_known_args()
    module_globals["ARGS"] = _ARGS
    unittest.main(module=module_globals["__name__"], argv=[sys.argv[0], "-v", *rest])


class ScriptedServerCase(unittest.TestCase):
    """Base of the unittest classes that run `osprey serve` on the test-only scripted backend
    ($OSPREY_TEST_SCRIPT): every request generates the class's SCRIPT; the server is named MODEL and
    cls.client is an official openai client for it (a dependency of the tests, not of this module)."""
    SCRIPT = None
    MODEL = None

    @classmethod
    def setUpClass(cls):
        if cls.SCRIPT is None:
            raise unittest.SkipTest("base class")
        import openai
        env = test_env(_ARGS.build_dir, _ARGS.shared_dir)
        env["OSPREY_TEST_SCRIPT"] = cls.SCRIPT
        cls.server = OspreyServer(_ARGS.osprey, ["--served-model-name", cls.MODEL], env=env).__enter__()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
