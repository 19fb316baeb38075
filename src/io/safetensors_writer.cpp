#include "io/safetensors_writer.h"

#include <cstdio>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <numeric>

#include "core/check.h"
#include "core/json.h"
#include "core/thread_pool.h"

namespace osprey::io {

namespace fs = std::filesystem;

size_t TensorSpec::nbytes() const {
    size_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= size_t(d);
    return n;
}

namespace {

// Data order: dtype size descending, stable (so each tensor is aligned to its element size).
std::vector<size_t> data_order(const std::vector<TensorSpec>& specs) {
    std::vector<size_t> order(specs.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return dtype_size(specs[a].dtype) > dtype_size(specs[b].dtype); });
    return order;
}

void write_all(int fd, const uint8_t* p, size_t n, const fs::path& path) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, std::min(n, size_t(1) << 30));
        if (w < 0 && errno == EINTR) continue;
        OSPREY_CHECK(w > 0, path.string(), ": write failed: ", std::strerror(errno));
        p += w;
        n -= size_t(w);
    }
}

}  // namespace

std::string make_header(const std::vector<TensorSpec>& specs,
                        const std::vector<std::pair<std::string, std::string>>& metadata) {
    json::Value root{json::Object{}};
    if (!metadata.empty()) {
        json::Value meta{json::Object{}};
        for (const auto& [k, v] : metadata) meta.set(k, v);
        root.set("__metadata__", meta);
    }
    uint64_t offset = 0;
    for (size_t i : data_order(specs)) {
        const TensorSpec& s = specs[i];
        OSPREY_CHECK(!s.name.empty() && s.name != "__metadata__", "safetensors writer: bad tensor name '", s.name, "'");
        OSPREY_CHECK(root.find(s.name) == nullptr, "safetensors writer: duplicate tensor '", s.name, "'");
        json::Value shape{json::Array{}};
        for (int64_t d : s.shape) {
            OSPREY_CHECK(d >= 0, "safetensors writer: tensor '", s.name, "' has negative dimension ", d);
            shape.push_back(d);
        }
        json::Value entry{json::Object{}};
        entry.set("dtype", dtype_name(s.dtype));
        entry.set("shape", shape);
        entry.set("data_offsets", json::Array{json::Value(offset), json::Value(offset + s.nbytes())});
        root.set(s.name, entry);
        offset += s.nbytes();
    }
    std::string text = root.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
    return out + text;
}

uint64_t write_safetensors(const fs::path& path, const std::vector<TensorSpec>& specs,
                           const std::vector<std::pair<std::string, std::string>>& metadata, const FillFn& fill,
                           const WriteOptions& options) {
    const std::string header = make_header(specs, metadata);
    const fs::path tmp = path.string() + ".partial";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    OSPREY_CHECK(fd >= 0, tmp.string(), ": cannot create: ", std::strerror(errno));

    // A piece is a byte range of one tensor that lands in the current chunk.
    struct Piece {
        size_t tensor;
        uint64_t offset;
        size_t n;
        size_t at;  // position in the chunk buffer
    };
    constexpr size_t kTask = size_t(1) << 20;  // fill granularity across threads
    uint64_t data_bytes = 0;
    for (const TensorSpec& s : specs) data_bytes += s.nbytes();
    const size_t chunk = size_t(std::max<uint64_t>(std::min<uint64_t>(options.chunk_bytes, data_bytes), 1));
    ThreadPool pool(data_bytes > kTask ? options.threads : 1);
    std::vector<uint8_t> buffers[2] = {std::vector<uint8_t>(chunk), std::vector<uint8_t>(chunk)};
    std::future<void> pending;
    uint64_t total = header.size();
    try {
        write_all(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), tmp);
        const std::vector<size_t> order = data_order(specs);
        size_t oi = 0;
        uint64_t off = 0;
        int which = 0;
        while (oi < order.size()) {
            std::vector<Piece> pieces;
            size_t used = 0;
            while (oi < order.size() && used < chunk) {
                const size_t t = order[oi];
                const uint64_t size = specs[t].nbytes();
                while (off < size && used < chunk) {
                    const size_t n = size_t(std::min<uint64_t>({size - off, chunk - used, kTask}));
                    pieces.push_back({t, off, n, used});
                    off += n;
                    used += n;
                }
                if (off >= size) {
                    ++oi;
                    off = 0;
                }
            }
            uint8_t* buf = buffers[which].data();
            pool.parallel_for(int64_t(pieces.size()), [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) fill(pieces[i].tensor, pieces[i].offset, buf + pieces[i].at, pieces[i].n);
            });
            if (pending.valid()) pending.get();  // the other buffer is written: free to refill next round
            pending = std::async(std::launch::async, [fd, buf, used, &tmp] { write_all(fd, buf, used, tmp); });
            total += used;
            which ^= 1;
        }
        if (pending.valid()) pending.get();
    } catch (...) {
        if (pending.valid()) pending.wait();
        ::close(fd);
        std::error_code ec;
        fs::remove(tmp, ec);
        throw;
    }
    OSPREY_CHECK(::close(fd) == 0, tmp.string(), ": close failed: ", std::strerror(errno));
    std::error_code ec;
    fs::rename(tmp, path, ec);
    OSPREY_CHECK(!ec, "cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message());
    return total;
}

std::string shard_file_name(size_t k, size_t last) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, last);
    return buf;
}

std::vector<std::vector<size_t>> group_into_shards(const std::vector<uint64_t>& sizes, uint64_t max_bytes) {
    std::vector<std::vector<size_t>> shards;
    uint64_t used = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (shards.empty() || (used > 0 && used + sizes[i] > max_bytes)) {
            shards.emplace_back();
            used = 0;
        }
        shards.back().push_back(i);
        used += sizes[i];
    }
    return shards;
}

}  // namespace osprey::io
