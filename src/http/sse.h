// Server-sent events framing (the WHATWG "text/event-stream" format): one event is an optional
// "event:" line, one "data:" line per line of the payload, and a blank line. Payload only: the caller
// chooses what goes in it (JSON, "[DONE]"). Tests: tests/http/test_sse.cpp.
#pragma once

#include <string>
#include <string_view>

namespace osprey::http {

// "event: NAME\n" (when `event` is not empty), "data: LINE\n" for each line of `data` (split at
// "\r\n", "\r" or "\n", which a client would otherwise read as the end of the field), then "\n".
std::string sse_event(std::string_view data, std::string_view event = {});

}  // namespace osprey::http
