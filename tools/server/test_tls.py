"""TLS: `osprey serve --ssl-certfile/--ssl-keyfile` with a self-signed certificate made here (openssl
CLI), used by the official openai client (httpx, verifying against that certificate): models, a chat
completion and a stream. A client that does not trust the certificate, and plain HTTP to the TLS
port, are refused. Scripted backend (fast; the transport is what is tested).

    python tools/server/test_tls.py --osprey build/osprey --build-dir build --shared-dir ../shared
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

import httpx
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import OspreyServer, test_env  # noqa: E402

SCRIPT = "<|channel|>final<|message|>Hello over TLS.<|return|>"


def make_certificate(folder):
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--shared-dir", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = make_certificate(tmp)
        env = test_env(args.build_dir, args.shared_dir)
        env["OSPREY_TEST_SCRIPT"] = SCRIPT
        with OspreyServer(args.osprey, ["--ssl-certfile", cert, "--ssl-keyfile", key, "--api-key", "k"], env) as s:
            assert s.url.startswith("https://127.0.0.1:"), s.url
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0,
                                   http_client=httpx.Client(verify=cert, timeout=30))
            models = client.models.list()
            model = models.data[0].id
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].message.content == "Hello over TLS.", r
            text = ""
            for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                        stream=True):
                for c in chunk.choices:
                    text += c.delta.content or ""
            assert text == "Hello over TLS.", text
            print("TLS: models, chat and a stream through the openai client: ok")

            untrusting = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
            try:
                untrusting.models.list()
                raise AssertionError("a client without the certificate was served")
            except openai.APIConnectionError:
                pass
            port = int(s.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
                try:
                    reply = sock.recv(4096)
                except ConnectionResetError:
                    reply = b""
                assert b"200 OK" not in reply, reply
            # The server still serves after both.
            assert client.models.list().data[0].id == model
            print("TLS: an untrusting client and plain HTTP are refused; the server keeps serving: ok")
    print("PASS")


if __name__ == "__main__":
    main()
