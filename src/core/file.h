// Whole-file reading and writing for configs, checkpoint indexes, rank files and reports: one error
// message naming the path and the system's reason. Tests: tests/core/test_file.cpp.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace osprey {

// The bytes of the file at `path`. Throws osprey::Error "cannot read PATH: cannot open (REASON)" when
// it cannot be opened and "cannot read PATH: read error (REASON)" when reading fails (a directory).
std::string read_file(const std::filesystem::path& path);

// Creates or truncates the file at `path` and writes `text`. Throws osprey::Error "cannot write PATH:
// cannot create (REASON)" or "cannot write PATH: write error (REASON)".
void write_file(const std::filesystem::path& path, std::string_view text);

}  // namespace osprey
