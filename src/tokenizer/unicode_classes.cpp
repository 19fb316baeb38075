// Expands the generated runs of code point classes into a two-stage lookup table.
#include "tokenizer/unicode_classes.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace osprey::tok {
namespace {

struct Run {
    uint32_t first;  // first code point of the run
    uint8_t flags;
};

constexpr Run kRuns[] = {
#include "tokenizer/unicode_classes_data.inc"
};

struct Tables {
    std::vector<uint16_t> stage1;  // [0x1100]
    std::vector<uint8_t> stage2;   // [n_blocks, 256]

    Tables() {
        std::vector<uint8_t> flat(0x110000);  // [0x110000]
        const size_t n_runs = sizeof(kRuns) / sizeof(kRuns[0]);
        for (size_t r = 0; r < n_runs; ++r) {
            const uint32_t end = r + 1 < n_runs ? kRuns[r + 1].first : 0x110000;
            std::memset(flat.data() + kRuns[r].first, kRuns[r].flags, end - kRuns[r].first);
        }
        std::unordered_map<std::string, uint16_t> blocks;
        stage1.resize(0x1100);
        for (uint32_t b = 0; b < 0x1100; ++b) {
            const std::string block(reinterpret_cast<const char*>(flat.data()) + b * 256, 256);
            auto [it, inserted] = blocks.emplace(block, uint16_t(blocks.size()));
            if (inserted) stage2.insert(stage2.end(), block.begin(), block.end());
            stage1[b] = it->second;
        }
    }
};

const Tables& tables() {
    static const Tables t;
    return t;
}

}  // namespace

namespace detail {
// NOTE: set during static initialisation of this translation unit; nothing calls classes_of()
// for non-ASCII code points before main() (tokenizers are built from files at run time).
const uint16_t* g_stage1 = tables().stage1.data();
const uint8_t* g_stage2 = tables().stage2.data();

}  // namespace detail

}  // namespace osprey::tok
