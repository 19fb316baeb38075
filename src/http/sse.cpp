// Server-sent events framing (see sse.h).
#include "http/sse.h"

namespace osprey::http {

std::string sse_event(std::string_view data, std::string_view event) {
    std::string out;
    out.reserve(data.size() + event.size() + 16);
    if (!event.empty()) {
        out += "event: ";
        out += event;
        out += '\n';
    }
    for (;;) {
        const size_t end = data.find_first_of("\r\n");
        out += "data: ";
        out += data.substr(0, end);
        out += '\n';
        if (end == std::string_view::npos) break;
        data.remove_prefix(end + (data.substr(end, 2) == "\r\n" ? 2 : 1));
    }
    out += '\n';
    return out;
}

}  // namespace osprey::http
