// Shared helpers of the server tests: the o200k_harmony tokenizer from shared/data, and client
// sockets to an in-process server on the loopback.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "tokenizer/tokenizer.h"

namespace osprey::test {

inline const tok::Tokenizer& harmony_tokenizer() {
    static const tok::Tokenizer t = tok::Tokenizer::from_tiktoken_file(std::string(OSPREY_SHARED_DIR) +
                                                                       "/data/o200k_base.tiktoken");
    return t;
}

// A client socket connected to 127.0.0.1:port from `source` (another loopback address stands for
// another client), with a 10 s receive timeout and optionally a small receive buffer.
inline int connect_loopback(int port, const char* source = "127.0.0.1", int rcvbuf = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &local.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

// Writes all of `s` (partial sends retried).
inline void send_all(int fd, const std::string& s) {
    size_t sent = 0;
    while (sent < s.size()) {
        const ssize_t n = ::send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
        ASSERT_GT(n, 0);
        sent += size_t(n);
    }
}

}  // namespace osprey::test
