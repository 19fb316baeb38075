// core/file.h: whole-file reading and its error messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/file.h"

namespace fs = std::filesystem;

namespace {

std::string error_of(const fs::path& p) {
    try {
        osprey::read_file(p);
    } catch (const osprey::Error& e) {
        return e.what();
    }
    return "";
}

TEST(file, reads_every_byte) {
    const fs::path p = fs::temp_directory_path() / ("osprey_test_file_" + std::to_string(::getpid()));
    std::string bytes(200000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + i / 256);  // NULs and high bytes too
    std::ofstream(p, std::ios::binary) << bytes;
    EXPECT_EQ(osprey::read_file(p), bytes);
    std::ofstream(p, std::ios::binary | std::ios::trunc).flush();
    EXPECT_EQ(osprey::read_file(p), "");
    fs::remove(p);
}

TEST(file, errors_name_the_path_and_the_reason) {
    // Config::load's test checks "PATH: cannot open", `osprey bench plot`'s "cannot read PATH".
    const std::string missing = error_of("/nonexistent/config.json");
    EXPECT_NE(missing.find("cannot read /nonexistent/config.json: cannot open (No such file"), std::string::npos)
        << missing;
    const std::string dir = error_of(fs::temp_directory_path());
    EXPECT_NE(dir.find("cannot read " + fs::temp_directory_path().string() + ": "), std::string::npos) << dir;
}

}  // namespace

namespace {

TEST(file, writes_and_truncates) {
    const fs::path p = fs::temp_directory_path() / ("osprey_test_write_" + std::to_string(::getpid()));
    std::string bytes(70000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 13 + 1);
    osprey::write_file(p, bytes);
    EXPECT_EQ(osprey::read_file(p), bytes);
    osprey::write_file(p, "short");
    EXPECT_EQ(osprey::read_file(p), "short") << "the old, longer contents must be gone";
    fs::remove(p);
    try {
        osprey::write_file("/nonexistent/dir/file.json", "x");
        FAIL() << "no error for a missing directory";
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot write /nonexistent/dir/file.json: cannot create"), std::string::npos)
            << e.what();
    }
}

}  // namespace
