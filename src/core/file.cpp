#include "core/file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/check.h"

namespace osprey {

std::string read_file(const std::filesystem::path& path) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) OSPREY_FAIL("cannot read ", path.string(), ": cannot open (", std::strerror(errno), ")");
    std::string data;
    std::error_code ec;
    if (const auto size = std::filesystem::file_size(path, ec); !ec) data.reserve(size_t(size));
    char buf[1 << 16];
    for (;;) {
        const size_t n = std::fread(buf, 1, sizeof buf, f.get());
        data.append(buf, n);
        if (n < sizeof buf) break;
    }
    if (std::ferror(f.get())) OSPREY_FAIL("cannot read ", path.string(), ": read error (", std::strerror(errno), ")");
    return data;
}

void write_file(const std::filesystem::path& path, std::string_view text) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
    if (!f) OSPREY_FAIL("cannot write ", path.string(), ": cannot create (", std::strerror(errno), ")");
    const bool ok = std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
    const bool closed = std::fclose(f.release()) == 0;
    if (!ok || !closed) OSPREY_FAIL("cannot write ", path.string(), ": write error (", std::strerror(errno), ")");
}

}  // namespace osprey
