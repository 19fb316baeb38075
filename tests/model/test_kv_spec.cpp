// The KV spec: which layers are paged and which are rings, the sizes the engine budgets with (checked
// against shared/spec/gpt-oss-model.md §2.3), the replay length, the page-size bounds, and copy plans.
#include <gtest/gtest.h>

#include "core/check.h"
#include "model/kv_spec.h"
#include "model/synthetic.h"

namespace osprey::model {
namespace {

TEST(kv_spec, even_layers_are_rings_odd_layers_are_paged) {
    const KvSpec spec(preset_config("20b"), KvDtype::bf16, 32);
    ASSERT_EQ(spec.n_layers(), 24);
    EXPECT_EQ(spec.paged().layers.size(), 12u);
    EXPECT_EQ(spec.ring().layers.size(), 12u);
    for (int layer = 0; layer < 24; ++layer) {
        EXPECT_EQ(spec.is_ring(layer), layer % 2 == 0) << layer;
        EXPECT_EQ(is_sliding_layer(layer), layer % 2 == 0) << layer;
    }
    EXPECT_EQ(spec.paged().layers.front(), 1);
    EXPECT_EQ(spec.ring().layers.front(), 0);
    EXPECT_THROW(spec.kind_of(24), Error);
    // 120b: 36 layers, 18 of each.
    const KvSpec big(preset_config("120b"), KvDtype::bf16, 32);
    EXPECT_EQ(big.paged().layers.size(), 18u);
    EXPECT_EQ(big.ring().layers.size(), 18u);
}

TEST(kv_spec, sizes_match_the_model_spec) {
    // §2.3: BF16 K and V, 512 values each per position and layer. 20b: 12 full layers -> 24 576 B per
    // token; 12 sliding layers x 128 rows x 2048 B = 3 MiB per sequence.
    const KvSpec spec(preset_config("20b"), KvDtype::bf16, 32);
    EXPECT_EQ(spec.tensor_row_bytes(), 1024u);
    EXPECT_EQ(spec.paged().bytes_per_row, 2048u);
    EXPECT_EQ(spec.bytes_per_page(), 32u * 24576u);
    EXPECT_EQ(spec.bytes_per_window_slot(), size_t(3) << 20);
    EXPECT_EQ(spec.paged().rows_per_block, 32);
    EXPECT_EQ(spec.ring().rows_per_block, 128);
    // f32 doubles both; the page size scales only the pages.
    const KvSpec f32(preset_config("20b"), KvDtype::f32, 16);
    EXPECT_EQ(f32.bytes_per_page(), 16u * 24576u * 2u);
    EXPECT_EQ(f32.bytes_per_window_slot(), size_t(6) << 20);
    // A layout's bytes are its blocks' bytes.
    const KvLayout layout{.spec = spec, .n_pages = 10, .n_window_slots = 3};
    EXPECT_EQ(layout.bytes(), 10 * spec.bytes_per_page() + 3 * spec.bytes_per_window_slot());
    EXPECT_EQ(layout.rows(KvGroupKind::paged), 320);
    EXPECT_EQ(layout.rows(KvGroupKind::ring), 384);
}

TEST(kv_spec, replay_covers_every_ring_layer) {
    EXPECT_EQ(KvSpec(preset_config("20b"), KvDtype::bf16, 32).window_replay(), 12 * 127);
    EXPECT_EQ(KvSpec(preset_config("tiny"), KvDtype::f32, 32).window_replay(), 2 * 127);
}

// Speculative decoding: k spare rows per ring (a rollback never loses a needed row); pages, the
// window itself and the replay length are unchanged.
TEST(kv_spec, ring_slack_adds_rows_to_rings_only) {
    const KvSpec spec(preset_config("20b"), KvDtype::bf16, 32);
    const KvSpec slack = spec.with_ring_slack(4);
    EXPECT_EQ(spec.ring_slack(), 0);
    EXPECT_EQ(slack.ring_slack(), 4);
    EXPECT_EQ(slack.ring().rows_per_block, 132);
    EXPECT_EQ(slack.sliding_window(), 128);
    EXPECT_EQ(slack.bytes_per_page(), spec.bytes_per_page());
    EXPECT_EQ(slack.bytes_per_window_slot(), spec.bytes_per_window_slot() / 128 * 132);
    EXPECT_EQ(slack.window_replay(), spec.window_replay());
    EXPECT_THROW((void)spec.with_ring_slack(-1), Error);
}

TEST(kv_spec, page_size_bounds_live_here) {
    EXPECT_NO_THROW(check_page_size(kMinPageSize));
    EXPECT_NO_THROW(check_page_size(kMaxPageSize));
    for (int bad : {0, -1, kMaxPageSize + 1, 2048}) {
        try {
            check_page_size(bad, "--page-size");
            ADD_FAILURE() << bad << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("--page-size must be in [1, 1024]"), std::string::npos) << e.what();
        }
        EXPECT_THROW(KvSpec(preset_config("tiny"), KvDtype::f32, bad), Error) << bad;
    }
}

TEST(kv_spec, copy_plans_stay_inside_the_layout) {
    const KvLayout layout{.spec = KvSpec(preset_config("tiny"), KvDtype::f32, 8), .n_pages = 4, .n_window_slots = 2};
    // Pages 0,1 -> 2,3 merge into one run; the ring run is one slot of 128 rows.
    const KvCopyPlan plan =
        plan_kv_copy({.src_pages = {0, 1}, .dst_pages = {2, 3}, .src_slot = 0, .dst_slot = 1}, layout);
    ASSERT_EQ(plan.runs.size(), 2u);
    EXPECT_EQ(plan.runs[0].group, KvGroupKind::paged);
    EXPECT_EQ(plan.runs[0].n, 16);
    EXPECT_EQ(plan.runs[1].group, KvGroupKind::ring);
    EXPECT_EQ(plan.runs[1].dst, 128);
    EXPECT_NO_THROW(check_kv_copy_plan(plan, layout));
    EXPECT_THROW(check_kv_copy_plan({{{KvGroupKind::ring, 128, 256, 1}}}, layout), Error);  // past the last ring
    EXPECT_THROW(check_kv_copy_plan({{{KvGroupKind::paged, 0, 8, 16}}}, layout), Error);    // overlaps itself
    EXPECT_THROW(check_kv_copy_plan({{{KvGroupKind::paged, -8, 8, 8}}}, layout), Error);    // negative row
    EXPECT_THROW(plan_kv_copy({.src_pages = {0}, .dst_pages = {4}}, layout), Error);        // page 4 absent
    EXPECT_THROW(plan_kv_copy({.src_pages = {}, .dst_pages = {}, .src_slot = 0, .dst_slot = 2}, layout),
                 Error);  // slot 2
}

TEST(kv_spec, layouts_without_a_spec_are_refused) {
    const KvLayout empty{};
    EXPECT_THROW(empty.check("test"), Error);
    KvLayout negative{.spec = KvSpec(preset_config("tiny"), KvDtype::f32, 8), .n_pages = -1, .n_window_slots = 1};
    EXPECT_THROW(negative.check("test"), Error);
}

}  // namespace
}  // namespace osprey::model
