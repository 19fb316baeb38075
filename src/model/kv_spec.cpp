// The KV cache's layout as data (see kv_spec.h).
#include "model/kv_spec.h"

#include "core/check.h"

namespace osprey::model {

bool is_sliding_layer(int layer) {
    return layer % 2 == 0;
}

size_t kv_dtype_bytes(KvDtype dtype) {
    switch (dtype) {
        case KvDtype::f32:
            return 4;
        case KvDtype::bf16:
            return 2;
        case KvDtype::fp8_e4m3:
            return 1;
    }
    OSPREY_FAIL("unknown KV dtype ", int(dtype));
}

std::string_view kv_dtype_name(KvDtype dtype) {
    switch (dtype) {
        case KvDtype::f32:
            return "f32";
        case KvDtype::bf16:
            return "bf16";
        case KvDtype::fp8_e4m3:
            return "fp8";
    }
    return "?";
}

std::optional<KvDtype> parse_kv_dtype(std::string_view name, std::string_view flag) {
    if (name == "auto") return std::nullopt;
    if (name == "fp8" || name == "fp8_e4m3") return KvDtype::fp8_e4m3;
    if (name == "bf16") return KvDtype::bf16;
    if (name == "f32" || name == "float32") return KvDtype::f32;
    OSPREY_FAIL(flag, " must be auto, fp8, bf16 or f32, got '", name, "'");
}

void check_page_size(int page_size, std::string_view what) {
    OSPREY_CHECK(page_size >= kMinPageSize && page_size <= kMaxPageSize, what, " must be in [", kMinPageSize, ", ",
                 kMaxPageSize, "] tokens, got ", page_size);
}

KvSpec::KvSpec(const Config& config, KvDtype dtype, int page_size, int tp)
    : dtype_(dtype), page_size_(page_size), sliding_window_(config.sliding_window) {
    check_page_size(page_size);
    OSPREY_CHECK(tp >= 1 && config.n_kv_heads % tp == 0, "KV spec: ", config.n_kv_heads, " KV heads do not split over ",
                 tp, " tensor-parallel ranks");
    kv_dim_ = config.kv_dim() / tp;
    n_kv_heads_ = config.n_kv_heads / tp;
    OSPREY_CHECK(config.n_layers > 0 && config.sliding_window > 0 && config.kv_dim() > 0, "KV spec: ", config.n_layers,
                 " layers, sliding window ", config.sliding_window, ", kv_dim ", config.kv_dim());
    const size_t row = 2 * tensor_row_bytes();  // K and V
    groups_[size_t(KvGroupKind::paged)] = {KvGroupKind::paged, {}, page_size, row};
    groups_[size_t(KvGroupKind::ring)] = {KvGroupKind::ring, {}, config.sliding_window, row};
    kind_of_.resize(size_t(config.n_layers));
    for (int layer = 0; layer < config.n_layers; ++layer) {
        const KvGroupKind kind = is_sliding_layer(layer) ? KvGroupKind::ring : KvGroupKind::paged;
        kind_of_[size_t(layer)] = kind;
        groups_[size_t(kind)].layers.push_back(layer);
    }
}

KvSpec KvSpec::with_ring_slack(int extra) const {
    OSPREY_CHECK(extra >= 0 && extra <= 4096, "KV spec: ring slack must be in [0, 4096], got ", extra);
    KvSpec s = *this;
    s.groups_[size_t(KvGroupKind::ring)].rows_per_block = sliding_window_ + extra;
    return s;
}

KvGroupKind KvSpec::kind_of(int layer) const {
    OSPREY_CHECK(layer >= 0 && layer < n_layers(), "KV spec: layer ", layer, " outside [0, ", n_layers(), ")");
    return kind_of_[size_t(layer)];
}

void KvLayout::check(std::string_view who) const {
    OSPREY_CHECK(spec.page_size() > 0 && n_pages >= 0 && n_window_slots >= 0, who, ": bad KV layout: page_size ",
                 spec.page_size(), ", ", n_pages, " pages, ", n_window_slots, " window slots");
}

KvCopyPlan plan_kv_copy(const KvCopy& copy, const KvLayout& layout) {
    OSPREY_CHECK(copy.src_pages.size() == copy.dst_pages.size(), "copy_kv: ", copy.src_pages.size(),
                 " source pages but ", copy.dst_pages.size(), " destination pages");
    OSPREY_CHECK((copy.src_slot < 0) == (copy.dst_slot < 0), "copy_kv: window slots ", copy.src_slot, " -> ",
                 copy.dst_slot, ": give both or neither");
    if (copy.src_slot >= 0) {
        OSPREY_CHECK(copy.src_slot < layout.n_window_slots && copy.dst_slot < layout.n_window_slots,
                     "copy_kv: window slots ", copy.src_slot, " -> ", copy.dst_slot, " outside [0, ",
                     layout.n_window_slots, ")");
        OSPREY_CHECK(copy.src_slot != copy.dst_slot, "copy_kv: window slot ", copy.src_slot, " copied onto itself");
    }
    std::vector<uint8_t> role(size_t(layout.n_pages), 0);  // 1: source, 2: destination
    for (size_t i = 0; i < copy.src_pages.size(); ++i) {
        const int32_t s = copy.src_pages[i], d = copy.dst_pages[i];
        OSPREY_CHECK(s >= 0 && s < layout.n_pages && d >= 0 && d < layout.n_pages, "copy_kv: page ", s, " -> ", d,
                     " outside [0, ", layout.n_pages, ")");
        role[size_t(s)] = 1;
    }
    for (int32_t d : copy.dst_pages) {
        OSPREY_CHECK(role[size_t(d)] == 0, "copy_kv: page ", d,
                     role[size_t(d)] == 1 ? " is both a source and a destination" : " is a destination twice");
        role[size_t(d)] = 2;
    }
    const int64_t ps = layout.spec.paged().rows_per_block;
    OSPREY_CHECK(copy.dp_group >= 0, "copy_kv: data-parallel group ", copy.dp_group);
    KvCopyPlan plan;
    plan.dp_group = copy.dp_group;
    for (size_t i = 0; i < copy.src_pages.size(); ++i) {
        const int64_t s = copy.src_pages[i] * ps, d = copy.dst_pages[i] * ps;
        KvRowRun* last = plan.runs.empty() ? nullptr : &plan.runs.back();
        if (last && last->src + last->n == s && last->dst + last->n == d)
            last->n += ps;
        else
            plan.runs.push_back({KvGroupKind::paged, s, d, ps});
    }
    if (copy.src_slot >= 0) {
        const int64_t w = layout.spec.ring().rows_per_block;
        plan.runs.push_back({KvGroupKind::ring, copy.src_slot * w, copy.dst_slot * w, w});
    }
    return plan;
}

void check_kv_copy_plan(const KvCopyPlan& plan, const KvLayout& layout, int dp_groups) {
    OSPREY_CHECK(plan.dp_group >= 0 && plan.dp_group < dp_groups, "copy_kv: data-parallel group ", plan.dp_group,
                 " outside [0, ", dp_groups, ")");
    for (size_t i = 0; i < plan.runs.size(); ++i) {
        const KvRowRun& r = plan.runs[i];
        const int64_t rows = layout.rows(r.group);
        OSPREY_CHECK(r.n >= 0 && r.src >= 0 && r.dst >= 0 && r.src + r.n <= rows && r.dst + r.n <= rows,
                     "copy_kv: run ", i, " (rows ", r.src, " -> ", r.dst, ", ", r.n, " of them) outside the ", rows,
                     " rows of the ", r.group == KvGroupKind::ring ? "ring" : "paged", " layers");
        OSPREY_CHECK(r.src + r.n <= r.dst || r.dst + r.n <= r.src, "copy_kv: run ", i, " overlaps itself");
    }
}

}  // namespace osprey::model
