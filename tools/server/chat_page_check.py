"""Headless-Chromium check of the built-in chat page: the page served at / sends a message through the
real server (the test-only scripted backend, so the answer is known), the streamed reasoning and answer
must appear in the DOM (read with --dump-dom), and a PNG screenshot must not be blank (decoded here
with zlib: no image library needed).

    python tools/server/chat_page_check.py --osprey build/osprey --build-dir build --shared-dir ../shared
Exits 0 on success, 1 on failure, 77 when no chromium is installed (CTest reports a skip).
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.parse
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import OspreyServer, test_env  # noqa: E402

SCRIPT = ("<|channel|>analysis<|message|>The user says hello. Greet them back.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Hello from the Osprey chat page!<|return|>")
# A scripted tool call (issue 15): turn 0 calls get_weather (its arguments streamed in pieces), the
# page answers it (?tool_result=), and turn 1, whose prompt holds the call, answers. The call must
# render as one bubble with its name, the result as its own, and the history the page sends for
# turn 1 must be accepted (a 400 would show as an error in the bubble).
TOOL_SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
               "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>"
               "<<next turn>>"
               "<|channel|>final<|message|>It is sunny in Paris.<|return|>")
TOOLS = ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
         '"properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]')


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(binary, args, timeout=90):
    base = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--hide-scrollbars", "--window-size=1000,700", "--virtual-time-budget=15000"]
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run(base + ["--user-data-dir=" + profile] + args, capture_output=True, text=True, timeout=timeout)
    return r.stdout


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, "unexpected PNG format"
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--osprey", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--shared-dir", required=True)
    p.add_argument("--screenshot", default=None, help="where to keep the PNG (default: a temporary file)")
    a = p.parse_args()
    browser = find_chromium()
    if not browser:
        print("no chromium found (apt-get install chromium): skipped")
        return 77
    env = test_env(a.build_dir, a.shared_dir)
    env["OSPREY_TEST_SCRIPT"] = SCRIPT
    failures = []
    with OspreyServer(a.osprey, [], env=env) as server:
        page = server.url + "/?q=Hello%20there&max_tokens=64&effort=high"
        dom = chromium(browser, ["--dump-dom", page])
        for needle in ("Hello from the Osprey chat page!", "The user says hello. Greet them back.",
                       'data-done="1"', "Hello there", "finish: stop"):
            if needle not in dom:
                failures.append(f"DOM lacks {needle!r}")
        shot = a.screenshot or os.path.join(tempfile.mkdtemp(), "chat.png")
        chromium(browser, ["--screenshot=" + shot, page])
        if not os.path.exists(shot):
            failures.append("no screenshot written")
        else:
            width, height, channels, rows = png_pixels(shot)
            colors = set()
            for row in rows[::7]:
                for x in range(0, width * channels, channels * 5):
                    colors.add(row[x:x + 3])
            dark = sum(1 for row in rows for x in range(0, width * channels, channels * 3) if sum(row[x:x + 3]) < 200)
            print(f"screenshot {width}x{height}: {len(colors)} distinct sampled colours, {dark} dark samples")
            if len(colors) < 8 or dark < 50:
                failures.append("the screenshot looks blank")
    env["OSPREY_TEST_SCRIPT"] = TOOL_SCRIPT
    with OspreyServer(a.osprey, [], env=env) as server:
        page = (server.url + "/?q=" + urllib.parse.quote("Weather in Paris?") + "&tool_result=" +
                urllib.parse.quote("Sunny, 21 C") + "&tools=" + urllib.parse.quote(TOOLS))
        tool_dom = chromium(browser, ["--dump-dom", page])
        # The conversation only (the page's own script mentions "undefined" and "error:").
        start = tool_dom.find('<main id="log"')
        tool_dom = tool_dom[start:tool_dom.find("</main>", start)]
        call = 'tool call: get_weather({"city": "Paris", "unit": "celsius"})'
        for needle in (call, "get_weather → Sunny, 21 C", "It is sunny in Paris.", "finish: tool_calls"):
            if needle not in tool_dom:
                failures.append(f"tool-call DOM lacks {needle!r}")
        n_bubbles = tool_dom.count('class="tool"')
        if n_bubbles != 1:
            failures.append(f"{n_bubbles} tool-call bubbles, expected one")
        for bad in ("undefined", "error:"):
            if bad in tool_dom:
                failures.append(f"tool-call DOM holds {bad!r}")
        dom += tool_dom
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        print(dom[-3000:])
        return 1
    print("chat page OK: the answer and the reasoning streamed into the DOM; the screenshot is not blank; a "
          "streamed tool call rendered as one bubble, its result was sent back and the next turn answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
