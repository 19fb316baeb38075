// Byte-level BPE with tiktoken's merge order (see bpe.h). Test: tests/tokenizer/test_bpe.cpp.
#include "tokenizer/bpe.h"

#include <cstring>
#include <queue>

#include "core/check.h"

namespace osprey::tok {
namespace {

// Pieces up to this many bytes use the quadratic array merge (what tiktoken does for every piece);
// longer ones use a heap so that a megabyte of one script without spaces stays linear-logarithmic.
constexpr size_t kShortPiece = 128;

inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

inline uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h = (h << 29) | (h >> 35);
    }
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x100000001b3ULL;
    return mix(h);
}

constexpr int kIdBits = 18;
constexpr uint64_t kIdMask = (uint64_t(1) << kIdBits) - 1;
constexpr uint64_t kEmptyPair = ~uint64_t(0);
inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(a) << kIdBits) | uint64_t(b); }

// First (up to) 8 bytes, zero padded.
inline uint64_t prefix_of(std::string_view s) {
    uint64_t w = 0;
    std::memcpy(&w, s.data(), std::min<size_t>(8, s.size()));
    return w;
}

// Smallest power of two ≥ 1024 holding n entries at the given maximum load.
size_t table_size(size_t n, double max_load) {
    size_t cap = 1024;
    while (double(n) > max_load * double(cap)) cap <<= 1;
    return cap;
}

}  // namespace

Bpe::Bpe(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
    OSPREY_CHECK(tokens_.size() <= (size_t(1) << kIdBits), "a BPE vocabulary of ", tokens_.size(),
                 " tokens is larger than the ", size_t(1) << kIdBits, " supported");
    std::fill(std::begin(byte_rank_), std::end(byte_rank_), -1);
    by_bytes_.assign(table_size(tokens_.size(), 0.5), BytesSlot{});
    const size_t mask = by_bytes_.size() - 1;
    for (size_t r = 0; r < tokens_.size(); ++r) {
        const std::string& t = tokens_[r];
        OSPREY_CHECK(!t.empty(), "token with rank ", r, " is empty");
        const auto existing = rank_of(t);
        OSPREY_CHECK(!existing, "ranks ", existing.value_or(0), " and ", r, " have the same bytes");
        max_token_len_ = std::max(max_token_len_, t.size());
        size_t slot = hash_bytes(t) & mask;
        while (by_bytes_[slot].rank >= 0) slot = (slot + 1) & mask;
        by_bytes_[slot] = {prefix_of(t), uint32_t(t.size()), int32_t(r)};
        if (t.size() == 1) byte_rank_[uint8_t(t[0])] = int32_t(r);
    }
    for (int b = 0; b < 256; ++b) OSPREY_CHECK(byte_rank_[b] >= 0, "no token for the single byte ", b);
    byte_pair_rank_.assign(256 * 256, -1);
    for (size_t r = 0; r < tokens_.size(); ++r) {
        const std::string& t = tokens_[r];
        if (t.size() == 2) byte_pair_rank_[size_t(uint8_t(t[0])) * 256 + uint8_t(t[1])] = int32_t(r);
    }

    // Every way to cut a token into two tokens is a merge that yields it.
    std::vector<std::pair<uint64_t, int32_t>> pairs;
    pairs.reserve(tokens_.size() * 4);
    for (size_t r = 0; r < tokens_.size(); ++r) {
        const std::string_view t = tokens_[r];
        for (size_t k = 1; k < t.size(); ++k) {
            const auto a = rank_of(t.substr(0, k));
            if (!a) continue;
            const auto b = rank_of(t.substr(k));
            if (b) pairs.emplace_back(pair_key(*a, *b), int32_t(r));
        }
    }
    pairs_.assign(table_size(pairs.size(), 0.5), kEmptyPair);
    const size_t pmask = pairs_.size() - 1;
    for (const auto& [key, rank] : pairs) {
        size_t slot = mix(key) & pmask;
        while (pairs_[slot] != kEmptyPair) slot = (slot + 1) & pmask;
        pairs_[slot] = key << kIdBits | uint64_t(rank);
    }
}

uint64_t Bpe::hash_of(std::string_view bytes) { return hash_bytes(bytes); }

std::optional<int32_t> Bpe::rank_of(std::string_view bytes) const { return rank_of(bytes, hash_bytes(bytes)); }

std::optional<int32_t> Bpe::rank_of(std::string_view bytes, uint64_t hash) const {
    if (bytes.size() > max_token_len_ || bytes.empty()) return std::nullopt;
    const uint64_t prefix = prefix_of(bytes);
    const size_t mask = by_bytes_.size() - 1;
    for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
        const BytesSlot& s = by_bytes_[slot];
        if (s.rank < 0) return std::nullopt;
        if (s.prefix != prefix || s.len != bytes.size()) continue;
        if (bytes.size() <= 8) return s.rank;
        const std::string& t = tokens_[size_t(s.rank)];
        if (std::memcmp(t.data() + 8, bytes.data() + 8, bytes.size() - 8) == 0) return s.rank;
    }
}

int32_t Bpe::merged_rank(int32_t a, int32_t b) const {
    const uint64_t key = pair_key(a, b);
    const size_t mask = pairs_.size() - 1;
    for (size_t slot = mix(key) & mask;; slot = (slot + 1) & mask) {
        const uint64_t s = pairs_[slot];
        if (s == kEmptyPair) return -1;
        if ((s >> kIdBits) == key) return int32_t(s & kIdMask);
    }
}

void Bpe::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    encode_piece(piece, hash_bytes(piece), out);
}

void Bpe::encode_piece(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
        out.push_back(byte_rank_[uint8_t(piece[0])]);
        return;
    }
    if (const auto r = rank_of(piece, hash)) {
        out.push_back(*r);
        return;
    }
    if (piece.size() <= kShortPiece) {
        merge_short(piece, out);
    } else {
        merge_long(piece, out);
    }
}

// tiktoken's loop: parts in an array, the rank of merging each part with its right neighbour next
// to it; find the minimum (leftmost on ties), merge, refresh the two neighbouring pair ranks.
void Bpe::merge_short(std::string_view piece, std::vector<int32_t>& out) const {
    constexpr int32_t kNo = INT32_MAX;
    int32_t ids[kShortPiece];    // [m] current parts
    int32_t ranks[kShortPiece];  // [m - 1] rank of merging parts k and k + 1, kNo if none
    size_t m = piece.size();
    for (size_t k = 0; k < m; ++k) ids[k] = byte_rank_[uint8_t(piece[k])];
    for (size_t k = 0; k + 1 < m; ++k) {
        const int32_t r = byte_pair_rank_[size_t(uint8_t(piece[k])) * 256 + uint8_t(piece[k + 1])];
        ranks[k] = r < 0 ? kNo : r;
    }
    while (m > 1) {
        int32_t best = kNo;
        size_t at = 0;
        for (size_t k = 0; k + 1 < m; ++k) {
            if (ranks[k] < best) {
                best = ranks[k];
                at = k;
            }
        }
        if (best == kNo) break;
        ids[at] = best;
        std::memmove(ids + at + 1, ids + at + 2, (m - at - 2) * sizeof(int32_t));
        if (at + 3 < m) std::memmove(ranks + at + 1, ranks + at + 2, (m - at - 3) * sizeof(int32_t));
        --m;
        if (at + 1 < m) {
            const int32_t r = merged_rank(ids[at], ids[at + 1]);
            ranks[at] = r < 0 ? kNo : r;
        }
        if (at > 0) {
            const int32_t r = merged_rank(ids[at - 1], ids[at]);
            ranks[at - 1] = r < 0 ? kNo : r;
        }
    }
    out.insert(out.end(), ids, ids + m);
}

// The same merge order with a doubly linked list and a min-heap of (rank, left position): stale
// heap entries are recognised by a per-part version number.
void Bpe::merge_long(std::string_view piece, std::vector<int32_t>& out) const {
    const int32_t n = int32_t(piece.size());
    std::vector<int32_t> ids(n), next(n), prev(n), version(n, 0);  // [n] per part, indexed by first byte
    std::vector<bool> alive(n, true);                               // [n]
    for (int32_t k = 0; k < n; ++k) {
        ids[k] = byte_rank_[uint8_t(piece[k])];
        next[k] = k + 1;
        prev[k] = k - 1;
    }
    struct Entry {
        int32_t rank, left, right, left_version, right_version;
        bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](int32_t left) {
        const int32_t right = next[left];
        if (right >= n) return;
        const int32_t r = merged_rank(ids[left], ids[right]);
        if (r >= 0) heap.push({r, left, right, version[left], version[right]});
    };
    for (int32_t k = 0; k + 1 < n; ++k) {
        const int32_t r = byte_pair_rank_[size_t(uint8_t(piece[k])) * 256 + uint8_t(piece[k + 1])];
        if (r >= 0) heap.push({r, k, k + 1, 0, 0});
    }
    while (!heap.empty()) {
        const Entry e = heap.top();
        heap.pop();
        if (!alive[e.left] || !alive[e.right] || next[e.left] != e.right || version[e.left] != e.left_version ||
            version[e.right] != e.right_version) {
            continue;
        }
        ids[e.left] = e.rank;
        ++version[e.left];
        alive[e.right] = false;
        next[e.left] = next[e.right];
        if (next[e.left] < n) prev[next[e.left]] = e.left;
        push(e.left);
        if (prev[e.left] >= 0) push(prev[e.left]);
    }
    for (int32_t k = 0; k < n; k = next[k]) out.push_back(ids[k]);
}

}  // namespace osprey::tok
