// Parity of the CPU reference with Hugging Face transformers (GptOssForCausalLM in float32, MXFP4
// experts dequantised) on the synthetic tiny checkpoint. The golden files in tests/data/parity were
// made by tools/make_parity_goldens.sh (tools/hf_parity.py); manifest.json records how. The test
// regenerates the same checkpoint from the recorded preset and seed (the writer is deterministic), runs
// the prompts, and requires for every kept logit row
//   rel_err = max_i |ours_i - hf_i| / max_i |hf_i|  <=  1e-4     (over the row's kept vocabulary ids)
// and the same 32-token greedy continuation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/json.h"
#include "test_reference_util.h"

namespace osprey::model {
namespace {

constexpr double kMaxRelErr = 1e-4;

std::filesystem::path golden_dir() {
    if (const char* env = std::getenv("OSPREY_PARITY_DIR"); env && *env) return env;  // to try new goldens
    return std::filesystem::path(OSPREY_SOURCE_DIR) / "tests" / "data" / "parity";
}

template <typename T>
std::vector<T> read_binary(const std::filesystem::path& path, size_t count) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("missing golden file " + path.string());
    std::vector<T> v(count);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(count * sizeof(T)));
    if (size_t(in.gcount()) != count * sizeof(T) || in.peek() != EOF)
        throw Error(path.string() + ": expected exactly " + std::to_string(count * sizeof(T)) + " bytes");
    return v;
}

json::Value read_manifest() {
    std::ifstream in(golden_dir() / "manifest.json");
    if (!in) throw Error("missing " + (golden_dir() / "manifest.json").string());
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
}

std::vector<int32_t> int_list(const json::Value& v) {
    std::vector<int32_t> out;
    for (const json::Value& x : v.as_array()) out.push_back(int32_t(x.as_int()));
    return out;
}

// The checksum tools/hf_parity.py records: over every *.safetensors file (sorted by name), the sum
// of w_i * (2i + 1) mod 2^64 for the bytes read as little-endian uint64 words w_i (zero-padded).
std::pair<std::string, uint64_t> checkpoint_checksum(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    uint64_t sum = 0, index = 0, bytes = 0;
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        bytes += data.size();
        data.resize((data.size() + 7) / 8 * 8, 0);
        for (size_t i = 0; i < data.size(); i += 8, ++index) {
            uint64_t w;
            std::memcpy(&w, data.data() + i, 8);  // little-endian host
            sum += w * (2 * index + 1);
        }
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
    return {hex, bytes};
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, logits_and_greedy_continuation_match_transformers) {
    const json::Value manifest = read_manifest();
    const json::Value& ckpt = manifest.at("checkpoint");
    const std::string preset = ckpt.at("preset").as_string();
    const uint64_t seed = uint64_t(ckpt.at("seed").as_int());
    const json::Value* case_json = nullptr;
    for (const json::Value& c : manifest.at("cases").as_array())
        if (c.at("name").as_string() == GetParam()) case_json = &c;
    ASSERT_NE(case_json, nullptr) << "no case " << GetParam() << " in the manifest";
    const json::Value& c = *case_json;

    const std::vector<int32_t> prompt = int_list(c.at("prompt_ids"));
    const std::vector<int32_t> positions = int_list(c.at("positions"));
    const std::vector<int32_t> want_greedy = int_list(c.at("greedy_tokens"));
    const size_t k = size_t(c.at("ids_per_row").as_int());
    const auto ids = read_binary<int32_t>(golden_dir() / c.at("ids_file").as_string(), positions.size() * k);
    const auto want = read_binary<float>(golden_dir() / c.at("logits_file").as_string(), positions.size() * k);

    const Config config = preset_config(preset);
    const std::filesystem::path dir = test::synthetic_checkpoint(preset + "-" + std::to_string(seed), config, seed);
    const auto [sum, bytes] = checkpoint_checksum(dir);
    const json::Value& want_sum = ckpt.at("checksum");
    ASSERT_TRUE(sum == want_sum.at("sum").as_string() && int64_t(bytes) == want_sum.at("bytes").as_int())
        << "the synthetic writer no longer writes the checkpoint the goldens were made from (checksum " << sum
        << ", " << bytes << " bytes; goldens: " << want_sum.at("sum").as_string() << ", "
        << want_sum.at("bytes").as_int() << " bytes): regenerate them with tools/make_parity_goldens.sh";
    CpuReference ref(Weights::load(dir));
    const int total = int(prompt.size() + want_greedy.size());
    const int page_size = 32;
    ref.allocate_kv(kv_layout_for(ref, page_size, (total + page_size - 1) / page_size, 1));
    test::Seq seq{.tokens = prompt, .pages = test::pages_from(0, (total + page_size - 1) / page_size)};

    // Prefill in chunks that end at each kept position (chunked prefill equals one prefill exactly).
    double worst = 0.0;
    for (size_t r = 0; r < positions.size(); ++r) {
        ASSERT_GE(positions[r], seq.n_computed) << "positions must increase";
        const std::vector<float> logits = test::step(ref, seq, positions[r] + 1 - seq.n_computed);
        double max_diff = 0.0, max_ref = 0.0;
        for (size_t i = 0; i < k; ++i) {
            const int32_t id = ids[r * k + i];
            ASSERT_TRUE(id >= 0 && id < config.vocab_size) << "bad id in golden file";
            const double hf = want[r * k + i];
            max_diff = std::max(max_diff, std::abs(double(logits[size_t(id)]) - hf));
            max_ref = std::max(max_ref, std::abs(hf));
            ASSERT_FALSE(std::isnan(logits[size_t(id)])) << "position " << positions[r];
        }
        const double rel = max_diff / max_ref;
        worst = std::max(worst, rel);
        EXPECT_LE(rel, kMaxRelErr) << GetParam() << ": position " << positions[r] << " max |diff| " << max_diff
                                   << " of max |logit| " << max_ref;
    }
    ASSERT_EQ(seq.n_computed, int(prompt.size())) << "the last kept position must be the prompt's last token";
    std::printf("[parity] %s: %zu rows, worst relative logit error %.3g (bound %.0e)\n", GetParam().c_str(),
                positions.size(), worst, kMaxRelErr);

    // Greedy continuation through the KV cache (transformers recomputed the whole sequence each step).
    std::vector<int32_t> got;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingState state;
    SampleResult result;
    for (size_t i = 0; i < want_greedy.size(); ++i) {
        if (i > 0) {
            seq.tokens.push_back(got.back());
            test::step(ref, seq, 1);
        }
        ref.sample({&greedy, 1}, {&state, 1}, {&result, 1});
        got.push_back(result.token);
    }
    EXPECT_EQ(got, want_greedy);
}

INSTANTIATE_TEST_SUITE_P(hf, Parity, ::testing::Values("short", "long"));

// Layer by layer, with the dump hook's step names: the residual stream after each half-block and the
// router logits of every token of the short prompt, against transformers' (same inputs, one prefill).
TEST(ParitySteps, short_prompt_layer_by_layer) {
    constexpr double kMaxStepRelErr = 1e-5;
    const json::Value manifest = read_manifest();
    const json::Value* short_case = nullptr;
    for (const json::Value& c : manifest.at("cases").as_array())
        if (c.at("name").as_string() == "short") short_case = &c;
    ASSERT_NE(short_case, nullptr);
    const json::Value& c = *short_case;
    ASSERT_FALSE(c.at("steps_file").is_null()) << "the goldens have no intermediates";
    const std::vector<int32_t> prompt = int_list(c.at("prompt_ids"));
    size_t total = 0;
    for (const json::Value& st : c.at("steps").as_array())
        total = std::max(total, size_t(st.at("offset").as_int() + st.at("width").as_int() * int64_t(prompt.size())));
    const auto want = read_binary<float>(golden_dir() / c.at("steps_file").as_string(), total);

    const json::Value& ckpt = manifest.at("checkpoint");
    const std::string preset = ckpt.at("preset").as_string();
    const uint64_t seed = uint64_t(ckpt.at("seed").as_int());
    CpuReference ref(
        Weights::load(test::synthetic_checkpoint(preset + "-" + std::to_string(seed), preset_config(preset), seed)));
    ref.allocate_kv(kv_layout_for(ref, 32, 1, 1));
    std::map<std::pair<std::string, int>, std::vector<float>> got;
    ref.set_dump([&](std::string_view name, int layer, std::span<const float> v) {
        got[{std::string(name), layer}].assign(v.begin(), v.end());
    });
    test::Seq seq{.tokens = prompt, .pages = {0}};
    test::step(ref, seq, int(prompt.size()));

    for (const json::Value& st : c.at("steps").as_array()) {
        const std::string name = st.at("name").as_string();
        const int layer = int(st.at("layer").as_int());
        const size_t width = size_t(st.at("width").as_int()), offset = size_t(st.at("offset").as_int());
        auto it = got.find({name, layer});
        ASSERT_NE(it, got.end()) << "the reference has no step " << name << " in layer " << layer;
        ASSERT_EQ(it->second.size(), width * prompt.size()) << name << " " << layer;
        double max_diff = 0.0, max_ref = 0.0;
        for (size_t i = 0; i < it->second.size(); ++i) {
            max_diff = std::max(max_diff, std::abs(double(it->second[i]) - want[offset + i]));
            max_ref = std::max(max_ref, std::abs(double(want[offset + i])));
        }
        EXPECT_LE(max_diff / max_ref, kMaxStepRelErr) << name << " layer " << layer << ": max |diff| " << max_diff
                                                      << " of max |value| " << max_ref;
        std::printf("[parity] %-13s layer %d: relative error %.3g\n", name.c_str(), layer, max_diff / max_ref);
    }
}

}  // namespace
}  // namespace osprey::model
