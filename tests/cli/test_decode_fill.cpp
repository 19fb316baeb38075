// The decode benchmark's cache fill is honest: after any fill (--kv-fill prefill, copy or shared),
// a decode step over the filled sequences gives the same logits as running each sequence's whole
// prompt through a fresh cache, so every sequence really attends over its `context` positions
// (shared pages, private tails and the replayed sliding-window rings included). With --dp 2 the
// sequences are spread over two data-parallel groups' caches (model/parallel_runner.h) and the same holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "benchtool/model_bench.h"
#include "core/check.h"
#include "model/gpt_oss_ref.h"
#include "model/parallel_runner.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace osprey::benchtool {
namespace {

namespace fs = std::filesystem;

// Removes the checkpoint folder when the test process exits.
struct TempDir {
    fs::path path;
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

const fs::path& tiny_model() {
    static const TempDir dir{[] {
        const fs::path d = fs::temp_directory_path() / ("osprey-bench-fill-" + std::to_string(::getpid()));
        fs::remove_all(d);
        model::SyntheticOptions o;
        o.preset = "tiny";
        o.seed = 3;
        o.out = d;
        o.threads = 1;
        model::write_synthetic_checkpoint(o);
        return d;
    }()};
    return dir.path;
}

// Logits after running `prompt` then `next` through a fresh single-sequence cache.
std::vector<float> reference_logits(model::CpuReference& ref, const std::vector<int32_t>& prompt, int32_t next) {
    const int n = int(prompt.size()) + 1;
    ref.allocate_kv(kv_layout_for(ref, 16, (n + 15) / 16, 1));
    model::ForwardBatch b;
    b.tokens = prompt;
    b.tokens.push_back(next);
    model::SequenceSlice sl;
    sl.n_tokens = n;
    for (int p = 0; p < (n + 15) / 16; ++p) sl.pages.push_back(p);
    b.slices.push_back(sl);
    ref.forward(b);
    std::vector<float> out;
    ref.logits_to_host(out);
    return out;
}

void check_fill(KvFill fill, int context, int dp = 1) {
    std::unique_ptr<model::ModelRunner> owned;
    if (dp == 1)
        owned = std::make_unique<model::CpuReference>(model::Weights::load(tiny_model()),
                                                      model::CpuReferenceOptions{.n_threads = 1});
    else
        owned = std::make_unique<model::ParallelRunner>(
            model::Weights::load(tiny_model()),
            model::ParallelRunnerOptions{.layout = {.tp = 1, .ep = 1, .dp = dp}, .n_threads = 2});
    model::ModelRunner& runner = *owned;
    model::CpuReference ref(model::Weights::load(tiny_model()), {.n_threads = 1});
    const int vocab = runner.config().vocab_size;
    DecodeOptions o;
    o.batches = {1, 3};
    o.steps = 1;
    o.warmup = 0;
    o.page_size = 16;
    o.chunk = 64;  // several chunks per prompt and per replay
    o.fill = fill;
    const std::vector<DecodeSequence> seqs = fill_decode_cache(runner, o, context, 11);
    ASSERT_EQ(seqs.size(), 3u);

    model::ForwardBatch b;
    for (size_t i = 0; i < seqs.size(); ++i) {
        EXPECT_EQ(seqs[i].pos, context);
        ASSERT_EQ(int(seqs[i].prompt.size()), context);
        model::SequenceSlice sl;
        sl.first_token = int32_t(i);
        sl.n_tokens = 1;
        sl.start_pos = seqs[i].pos;
        sl.window_slot = seqs[i].slot;
        sl.pages = seqs[i].pages;
        sl.dp_group = seqs[i].dp_group;
        EXPECT_EQ(seqs[i].dp_group, int(i) % dp);
        b.slices.push_back(sl);
        b.tokens.push_back(seqs[i].last);
    }
    if (fill == KvFill::shared && context >= 2 * o.page_size) {  // the leading pages really are shared
        EXPECT_EQ(seqs[0].pages[0], seqs[2].pages[0]);
    }
    if (fill != KvFill::shared) {  // every sequence owns its pages and ring (in its group's cache)
        for (size_t i = 1; i < seqs.size(); ++i) {
            if (seqs[i].dp_group != seqs[0].dp_group) continue;
            EXPECT_NE(seqs[i].slot, seqs[0].slot);
            for (int32_t p : seqs[i].pages)
                EXPECT_EQ(std::count(seqs[0].pages.begin(), seqs[0].pages.end(), p), 0) << "page " << p;
        }
    }
    if (fill == KvFill::copy && dp == 1) {  // the same prompt, different next tokens (different routing from step 1)
        EXPECT_EQ(seqs[1].prompt, seqs[0].prompt);
        EXPECT_NE(seqs[1].last, seqs[2].last);
    }
    if (fill == KvFill::copy && dp == 2) {  // copied within group 0
        EXPECT_EQ(seqs[2].prompt, seqs[0].prompt);
    }
    runner.forward(b);
    std::vector<float> got;
    runner.logits_to_host(got);
    ASSERT_EQ(got.size(), size_t(3) * vocab);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const std::vector<float> want = reference_logits(ref, seqs[i].prompt, seqs[i].last);
        double worst = 0, scale = 1;
        for (int v = 0; v < vocab; ++v) {
            worst = std::max(worst, double(std::fabs(got[i * vocab + v] - want[size_t(v)])));
            scale = std::max(scale, double(std::fabs(want[size_t(v)])));
        }
        // FP32 forward in a different token grouping: only summation-order differences remain.
        EXPECT_LE(worst, 1e-4 * scale) << "sequence " << i << ", fill " << kv_fill_name(fill) << ", context "
                                        << context;
    }
}

// Context 40: shared pages plus a private partial page; 300: longer than the replay of the tiny
// model's sliding layers (2 x 127 positions), so the window rings are rebuilt from a replay that
// starts after position 0.
TEST(DecodeFill, PrefillFillMatchesAFreshCache) {
    check_fill(KvFill::prefill, 40);
    check_fill(KvFill::prefill, 300);
}

TEST(DecodeFill, CopyFillMatchesAFreshCache) {
    check_fill(KvFill::copy, 40);
    check_fill(KvFill::copy, 300);
}

TEST(DecodeFill, EveryFillMatchesAFreshCacheWithDataParallelism) {
    for (KvFill fill : {KvFill::prefill, KvFill::copy, KvFill::shared}) check_fill(fill, 40, 2);
    check_fill(KvFill::shared, 300, 2);
}

// Batch sizes whose cache does not fit the budget are skipped and listed; the rest still run.
TEST(DecodeFill, BatchesThatDoNotFitAreSkipped) {
    model::CpuReference probe(model::Weights::load(tiny_model()), {.n_threads = 1});
    DecodeOptions o;
    o.batches = {1, 2, 4};
    o.contexts = {64};
    o.steps = 1;
    o.warmup = 0;
    o.page_size = 16;
    o.fill = KvFill::copy;
    DecodeOptions two = o;
    two.batches = {1, 2};
    const size_t budget = decode_kv_bytes(probe, two, 64);  // room for batch 2, not for batch 4
    model::CpuReference runner(model::Weights::load(tiny_model()), {.kv_budget_bytes = budget, .n_threads = 1});
    const DecodeResults res = run_decode(runner, o, 3.0, {});
    ASSERT_EQ(res.rows.size(), 2u);
    EXPECT_EQ(res.rows[0].batch, 1);
    EXPECT_EQ(res.rows[1].batch, 2);
    ASSERT_EQ(res.skipped.size(), 1u);
    EXPECT_EQ(res.skipped[0].batch, 4);
    EXPECT_EQ(res.skipped[0].context, 64);
    EXPECT_GT(res.skipped[0].kv_bytes_needed, budget);
    EXPECT_EQ(res.skipped[0].kv_bytes_available, budget);
    // Nothing fits: an error naming the cache size, not an empty report.
    o.batches = {4};
    model::CpuReference tight(model::Weights::load(tiny_model()), {.kv_budget_bytes = budget / 4, .n_threads = 1});
    EXPECT_THROW(run_decode(tight, o, 3.0, {}), Error);
}

TEST(DecodeFill, SharedFillMatchesAFreshCache) {
    check_fill(KvFill::shared, 40);
    check_fill(KvFill::shared, 300);
}

}  // namespace
}  // namespace osprey::benchtool
