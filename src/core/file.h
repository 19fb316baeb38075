// Whole-file reading for configs, checkpoint indexes, rank files and reports: one function, one error
// message naming the path and the system's reason. Tests: tests/core/test_file.cpp.
#pragma once

#include <filesystem>
#include <string>

namespace osprey {

// The bytes of the file at `path`. Throws osprey::Error "cannot read PATH: cannot open (REASON)" when
// it cannot be opened and "cannot read PATH: read error (REASON)" when reading fails (a directory).
std::string read_file(const std::filesystem::path& path);

}  // namespace osprey
