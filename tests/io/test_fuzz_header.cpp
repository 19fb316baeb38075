// Feeds the fuzz target ~20k random, structured-random and mutated headers (a few seconds), so the
// parser's "clean error or valid header" contract is checked on every CI run without libFuzzer.
// OSPREY_FUZZ_ITERATIONS=N runs more.
#include <cstdlib>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "io_test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using osprey::test::le64;

int iterations() {
    const char* env = std::getenv("OSPREY_FUZZ_ITERATIONS");
    return env ? std::max(1, std::atoi(env)) : 20000;
}

// A random header made of plausible pieces (valid or almost valid), followed by random data.
std::string structured(std::mt19937_64& rng) {
    auto pick = [&](std::initializer_list<const char*> xs) { return std::string(xs.begin()[rng() % xs.size()]); };
    auto num = [&]() -> std::string {
        switch (rng() % 8) {
            case 0: return "-1";
            case 1: return "1.5";
            case 2: return "18446744073709551615";
            case 3: return "9223372036854775807";
            case 4: return "\"3\"";
            default: return std::to_string(rng() % 24);
        }
    };
    std::string h = "{";
    const int n = int(rng() % 5);
    uint64_t off = 0;
    for (int i = 0; i < n; ++i) {
        if (i) h += ",";
        if (rng() % 10 == 0) {
            h += R"("__metadata__":{"format":)";
            h += pick({"\"pt\"", "1", "null", "[]"});
            h += "}";
            continue;
        }
        h += "\"t";
        h += std::to_string(rng() % 4);
        h += "\":{";
        h += "\"dtype\":\"";
        h += pick({"BF16", "U8", "F32", "F64", "I64", "Q4", "", "bf16"});
        h += "\",";
        h += "\"shape\":[";
        const int dims = int(rng() % 4);
        uint64_t numel = 1;
        for (int d = 0; d < dims; ++d) {
            const uint64_t v = rng() % 5;
            numel *= v;
            if (d) h += ",";
            h += rng() % 6 == 0 ? num() : std::to_string(v);
        }
        h += "],\"data_offsets\":[";
        const uint64_t len = rng() % 3 == 0 ? rng() % 32 : numel * 2;
        const uint64_t begin = rng() % 4 == 0 ? rng() % 40 : off;
        h += (rng() % 8 == 0 ? num() : std::to_string(begin)) + "," +
             (rng() % 8 == 0 ? num() : std::to_string(begin + len)) + "]";
        if (rng() % 12 == 0) h += ",\"extra\":0";
        h += "}";
        off = begin + len;
    }
    h += "}";
    h.append(rng() % 8, ' ');
    std::string data(rng() % 48, 'd');
    uint64_t len = h.size();
    if (rng() % 10 == 0) len = rng() % 4 == 0 ? rng() : h.size() + rng() % 64;  // lying length field
    return le64(len) + h + data;
}

// A well-formed file: padded header (length 96 with the prefix) and one BF16 [2, 2] tensor.
std::string valid_file() {
    std::string h = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";
    h.append((8 - h.size() % 8) % 8, ' ');
    return le64(h.size()) + h + std::string(8, 'x');
}

std::string mutate(std::string s, std::mt19937_64& rng) {
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t at = rng() % s.size();
        switch (rng() % 5) {
            case 0: s[at] = char(rng()); break;                            // byte flip
            case 1: s.erase(at, 1 + rng() % 4); break;                      // deletion
            case 2: s.insert(at, 1, "{}[],:\"0-.e \\"[rng() % 13]); break;  // JSON punctuation
            case 3: s.resize(at); break;                                    // truncation
            case 4: s[at] ^= char(1 << (rng() % 8)); break;                 // bit flip
        }
    }
    return s;
}

TEST(fuzz_safetensors_header, random_inputs_give_errors_not_crashes) {
    std::mt19937_64 rng(20251129);
    const std::string valid = valid_file();
    int accepted = 0;
    const int n = iterations();
    for (int i = 0; i < n; ++i) {
        std::string input;
        switch (i % 4) {
            case 0: input = structured(rng); break;
            case 1: input = mutate(structured(rng), rng); break;
            case 2: input = mutate(valid, rng); break;
            case 3: {
                input.resize(rng() % 64);
                for (char& c : input) c = char(rng());
                if (rng() % 2) input = le64(input.size()) + input;
            }
        }
        // The target aborts on a broken invariant; any exception other than osprey::Error escapes here.
        try {
            LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
        } catch (const std::exception& e) {
            FAIL() << "input " << i << " threw a non-osprey exception: " << e.what();
        }
        // Count the accepted ones too: the generator must exercise the success path as well.
        try {
            osprey::io::parse_header(reinterpret_cast<const uint8_t*>(input.data()), input.size(), "x");
            ++accepted;
        } catch (const osprey::Error&) {
        }
    }
    EXPECT_GT(accepted, n / 50) << "the generated inputs hardly ever parse; the fuzz test lost its teeth";
    EXPECT_LT(accepted, n) << "every input parsed; the mutations do nothing";
}

TEST(fuzz_safetensors_header, valid_seed_parses) {
    const std::string valid = valid_file();
    const auto h = osprey::io::parse_header(reinterpret_cast<const uint8_t*>(valid.data()), valid.size(), "seed");
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(h.data_start, 96u);
    EXPECT_EQ(h.metadata.size(), 1u);
}

}  // namespace
