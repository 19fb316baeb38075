// Helpers for the checkpoint I/O tests: scratch folders, raw safetensors files, error matching.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"

namespace osprey::test {

// A fresh, empty folder unique to this process and `name`; removed again by the destructor.
struct ScratchDir {
    std::filesystem::path path;
    explicit ScratchDir(const std::string& name) {
        path = std::filesystem::temp_directory_path() / ("osprey_test_" + std::to_string(::getpid()) + "_" + name);
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::filesystem::path operator/(const std::string& f) const { return path / f; }
};

inline std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return s;
}

// A safetensors file from a header text (length prefix added) and raw data bytes.
inline std::string raw_safetensors(const std::string& header, const std::string& data) {
    return le64(header.size()) + header + data;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs fn, expects an osprey::Error whose message contains every one of `parts`; returns the message.
inline std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
        fn();
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
        return msg;
    }
    ADD_FAILURE() << "no osprey::Error thrown (expected one mentioning '" << (parts.empty() ? "" : parts[0]) << "')";
    return "";
}

}  // namespace osprey::test
