// Server-sent events framing (src/http/sse.h).
#include <gtest/gtest.h>

#include "http/sse.h"

namespace osprey::http {
namespace {

TEST(Sse, DataOnly) {
    EXPECT_EQ(sse_event(R"({"a":1})"), "data: {\"a\":1}\n\n");
    EXPECT_EQ(sse_event("[DONE]"), "data: [DONE]\n\n");
    EXPECT_EQ(sse_event(""), "data: \n\n");
}

TEST(Sse, NamedEvent) {
    EXPECT_EQ(sse_event("{}", "response.created"), "event: response.created\ndata: {}\n\n");
}

TEST(Sse, EveryLineBreakStartsANewDataLine) {
    EXPECT_EQ(sse_event("a\nb"), "data: a\ndata: b\n\n");
    EXPECT_EQ(sse_event("a\r\nb\rc\n"), "data: a\ndata: b\ndata: c\ndata: \n\n");
    EXPECT_EQ(sse_event("\n\n", "e"), "event: e\ndata: \ndata: \ndata: \n\n");
}

}  // namespace
}  // namespace osprey::http
