// A read-only memory mapping of a whole file (POSIX mmap). The bytes are never copied into RAM by
// us; the kernel pages them in on access. Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace osprey::io {

class MappedFile {
public:
    MappedFile() = default;
    // Throws osprey::Error naming the path and the OS error when the file cannot be opened/mapped.
    explicit MappedFile(const std::filesystem::path& path);
    ~MappedFile();
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }  // [size()] bytes; nullptr for an empty file
    size_t size() const { return size_; }
    const std::filesystem::path& path() const { return path_; }

private:
    void release();
    std::filesystem::path path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace osprey::io
