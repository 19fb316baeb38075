#include "benchtool/model_bench.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "benchtool/run_info.h"
#include "core/check.h"
#include "core/sampling.h"

namespace osprey::benchtool {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Random prompt tokens below the special-token range (o200k's specials start at 199998).
std::vector<int32_t> random_tokens(std::mt19937_64& rng, const model::Config& c, int n) {
    const uint64_t limit = uint64_t(std::min(c.vocab_size, 199998));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = int32_t(rng() % limit);
    return t;
}

using Seq = DecodeSequence;

// Greedy tokens of the last forward's logit rows (on the backend; only ids come back).
std::vector<int32_t> sample_greedy(model::ModelRunner& runner, int rows) {
    std::vector<SamplingParams> params(static_cast<size_t>(rows));
    for (auto& p : params) p.temperature = 0.0f;
    std::vector<SamplingState> state(static_cast<size_t>(rows));
    std::vector<SampleResult> out(static_cast<size_t>(rows));
    runner.sample(params, state, out);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) ids[size_t(r)] = out[size_t(r)].token;
    return ids;
}

// Runs `tokens` at positions [s.pos, s.pos + n) in chunks; the first `n_cached` of them only refill
// the window ring (their full-layer K/V is already in shared pages). Returns the greedy next token.
int32_t prefill(model::ModelRunner& runner, Seq& s, const std::vector<int32_t>& tokens, int chunk, int n_cached = 0) {
    OSPREY_CHECK(!tokens.empty(), "prefill of an empty prompt");
    for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
        const int n = int(std::min(tokens.size() - i, size_t(chunk)));
        model::ForwardBatch b;
        b.tokens.assign(tokens.begin() + long(i), tokens.begin() + long(i) + n);
        model::SequenceSlice sl;
        sl.n_tokens = n;
        sl.start_pos = s.pos;
        sl.n_full_kv_cached = std::clamp(n_cached - int(i), 0, n);
        sl.window_slot = s.slot;
        sl.window_first = s.window_first;
        sl.pages = s.pages;
        sl.want_logits = i + size_t(n) == tokens.size();
        sl.dp_group = s.dp_group;
        b.slices.push_back(std::move(sl));
        runner.forward(b);
        s.pos += n;
    }
    return sample_greedy(runner, 1).at(0);
}

void check_positive_list(const std::vector<int>& v, const char* what, int max) {
    OSPREY_CHECK(!v.empty(), what, " is empty");
    for (int x : v) OSPREY_CHECK(x >= 1 && x <= max, what, " entries must be in [1, ", max, "], got ", x);
}

int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// Decode layout for one context: pages and slots.
struct DecodePlan {
    int n_shared_pages = 0;    // shared mode: whole pages of the common prompt
    int private_pages = 0;     // per sequence
    int n_pages = 0, n_slots = 0;
    int steps_total = 0;       // decode steps every sequence may take over all batch sizes
};

// One data-parallel group's cache: the sequences are spread over the groups (i % dp).
DecodePlan plan_decode(const DecodeOptions& o, int context, int dp_groups) {
    DecodePlan p;
    const int max_batch = ceil_div(*std::max_element(o.batches.begin(), o.batches.end()), dp_groups);
    p.steps_total = (o.warmup + o.steps) * int(o.batches.size());
    if (o.fill != KvFill::shared) {
        p.private_pages = ceil_div(int64_t(context) + p.steps_total, o.page_size);
        p.n_slots = max_batch;
    } else {
        p.n_shared_pages = context / o.page_size;
        const int tail = context - p.n_shared_pages * o.page_size;
        p.private_pages = ceil_div(int64_t(tail) + p.steps_total, o.page_size);
        p.n_slots = max_batch + 1;  // one more for the shared prefill
    }
    p.n_pages = p.n_shared_pages + p.private_pages * max_batch;
    return p;
}

}  // namespace

const char* kv_fill_name(KvFill f) {
    switch (f) {
        case KvFill::prefill:
            return "prefill";
        case KvFill::copy:
            return "copy";
        case KvFill::shared:
            return "shared";
    }
    return "?";
}

KvFill parse_kv_fill(const std::string& s) {
    if (s == "prefill") return KvFill::prefill;
    if (s == "copy") return KvFill::copy;
    if (s == "shared") return KvFill::shared;
    OSPREY_FAIL("--kv-fill must be 'prefill', 'copy' or 'shared', got '", s, "'");
}

json::Value DecodeSkip::to_json() const {
    json::Value v = json::Object{};
    v.set("context", context);
    v.set("batch", batch);
    v.set("kv_bytes_needed", int64_t(kv_bytes_needed));
    v.set("kv_bytes_available", int64_t(kv_bytes_available));
    return v;
}

json::Value PrefillRow::to_json() const {
    json::Value v = json::Object{};
    v.set("prompt_tokens", prompt_tokens);
    v.set("ttft_s", ttft_s.to_json());
    v.set("input_tokens_per_s", input_tokens_per_s);
    v.set("cost_per_million_input_usd", cost_per_million_input);
    return v;
}

json::Value DecodeRow::to_json() const {
    json::Value v = json::Object{};
    v.set("context", context);
    v.set("batch", batch);
    v.set("mean_context", mean_context);
    v.set("kv_fill", kv_fill);
    v.set("fill_s", fill_s);
    v.set("step_s", step_s.to_json());
    v.set("tokens_per_s_per_user", tokens_per_s_per_user);
    v.set("total_tokens_per_s", total_tokens_per_s);
    v.set("cost_per_million_output_usd", cost_per_million_output);
    return v;
}

std::vector<PrefillRow> run_prefill(model::ModelRunner& runner, const PrefillOptions& o, double price_per_hour,
                                    const ProgressFn& progress) {
    const model::Config& c = runner.config();
    check_positive_list(o.lengths, "prompt lengths", c.max_position - 1);
    OSPREY_CHECK(o.repeats >= 1 && o.repeats <= 100000, "--repeats must be in [1, 100000], got ", o.repeats);
    OSPREY_CHECK(o.warmup >= 0 && o.warmup <= 100000, "--warmup must be in [0, 100000], got ", o.warmup);
    OSPREY_CHECK(o.chunk >= 1, "--chunk must be >= 1, got ", o.chunk);
    model::check_page_size(o.page_size, "--page-size");
    const int longest = *std::max_element(o.lengths.begin(), o.lengths.end());
    const model::KvLayout layout = model::kv_layout_for(runner, o.page_size, ceil_div(longest, o.page_size), 1);
    const size_t need = layout.bytes();
    OSPREY_CHECK(need <= runner.kv_budget_bytes(), "a ", longest, "-token prompt needs ", need >> 20,
                 " MiB of KV cache, the backend offers ", runner.kv_budget_bytes() >> 20, " MiB");
    runner.allocate_kv(layout);
    Seq seq;
    seq.slot = 0;
    for (int p = 0; p < layout.n_pages; ++p) seq.pages.push_back(p);

    std::mt19937_64 rng(o.seed);
    std::vector<PrefillRow> rows;
    for (int len : o.lengths) {
        std::vector<double> times;
        for (int r = 0; r < o.warmup + o.repeats; ++r) {
            const std::vector<int32_t> prompt = random_tokens(rng, c, len);  // fresh tokens: no caching effects
            seq.pos = 0;  // a sequence starting at position 0 restarts its window ring (window_first 0)
            const auto t0 = Clock::now();
            prefill(runner, seq, prompt, o.chunk);
            const double s = seconds_since(t0);
            if (r >= o.warmup) times.push_back(s);
        }
        PrefillRow row;
        row.prompt_tokens = len;
        row.ttft_s = summarize(times);
        row.input_tokens_per_s = double(len) / row.ttft_s.median;
        row.cost_per_million_input = cost_per_million(price_per_hour, row.input_tokens_per_s);
        if (progress)
            progress(str("prefill ", len, " tokens: TTFT median ", row.ttft_s.median * 1e3, " ms, p90 ",
                         row.ttft_s.p90 * 1e3, " ms, ", row.input_tokens_per_s, " tokens/s, $",
                         row.cost_per_million_input, " per M input tokens"));
        rows.push_back(std::move(row));
    }
    return rows;
}

size_t decode_kv_bytes(const model::ModelRunner& runner, const DecodeOptions& o, int context) {
    const DecodePlan p = plan_decode(o, context, runner.dp_groups());
    return model::kv_layout_for(runner, o.page_size, p.n_pages, p.n_slots).bytes();
}

std::vector<DecodeSequence> fill_decode_cache(model::ModelRunner& runner, const DecodeOptions& o, int context,
                                              uint64_t seed) {
    const model::Config& c = runner.config();
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    const int dp = runner.dp_groups();
    const int per_group = ceil_div(max_batch, dp);  // sequences in one group's cache
    const DecodePlan plan = plan_decode(o, context, dp);
    const model::KvLayout layout = model::kv_layout_for(runner, o.page_size, plan.n_pages, plan.n_slots);
    runner.allocate_kv(layout);
    std::mt19937_64 rng(seed);
    std::vector<Seq> seqs(static_cast<size_t>(max_batch));
    for (int i = 0; i < max_batch; ++i) seqs[size_t(i)].dp_group = i % dp;
    if (o.fill != KvFill::shared) {
        for (int i = 0; i < max_batch; ++i) {
            Seq& s = seqs[size_t(i)];
            const int j = i / dp;  // index in its group
            s.slot = j;
            for (int p = 0; p < plan.private_pages; ++p) s.pages.push_back(j * plan.private_pages + p);
            if (o.fill == KvFill::prefill || j == 0) {
                s.prompt = random_tokens(rng, c, context);
                s.last = prefill(runner, s, s.prompt, o.chunk);
                continue;
            }
            // copy mode: the first sequence of the group's K/V into this sequence's pages and ring
            const Seq& first = seqs[size_t(s.dp_group)];
            const size_t n_prompt_pages = size_t(ceil_div(context, o.page_size));
            model::KvCopy copy;
            copy.src_pages.assign(first.pages.begin(), first.pages.begin() + long(n_prompt_pages));
            copy.dst_pages.assign(s.pages.begin(), s.pages.begin() + long(n_prompt_pages));
            copy.src_slot = first.slot;
            copy.dst_slot = s.slot;
            copy.dp_group = s.dp_group;
            runner.copy_kv(model::plan_kv_copy(copy, layout));
            s.prompt = first.prompt;
            s.window_first = first.window_first;
            s.pos = first.pos;
            s.last = random_tokens(rng, c, 1)[0];
        }
    } else {
        const int shared_len = plan.n_shared_pages * o.page_size;
        const std::vector<int32_t> common = random_tokens(rng, c, shared_len);
        std::vector<int32_t> shared_pages;
        for (int p = 0; p < plan.n_shared_pages; ++p) shared_pages.push_back(p);
        for (int g = 0; g < dp && shared_len > 0 && g < max_batch; ++g) {
            Seq writer;  // writes the shared pages' full-layer K/V once per group, with a slot of its own
            writer.slot = per_group;
            writer.pages = shared_pages;
            writer.dp_group = g;
            prefill(runner, writer, common, o.chunk);
        }
        const int replay = std::min(shared_len, layout.spec.window_replay());
        for (int i = 0; i < max_batch; ++i) {
            Seq& s = seqs[size_t(i)];
            const int j = i / dp;
            s.slot = j;
            s.pages = shared_pages;
            for (int p = 0; p < plan.private_pages; ++p)
                s.pages.push_back(plan.n_shared_pages + j * plan.private_pages + p);
            std::vector<int32_t> tokens(common.end() - replay, common.end());
            const std::vector<int32_t> tail = random_tokens(rng, c, context - shared_len);
            tokens.insert(tokens.end(), tail.begin(), tail.end());
            s.pos = shared_len - replay;
            s.window_first = s.pos;  // the replay refills an empty ring
            s.last = prefill(runner, s, tokens, o.chunk, replay);
            s.prompt = common;
            s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
        }
    }
    return seqs;
}

DecodeResults run_decode(model::ModelRunner& runner, const DecodeOptions& options, double price_per_hour,
                         const ProgressFn& progress) {
    const model::Config& c = runner.config();
    check_positive_list(options.batches, "batch sizes", 4096);
    check_positive_list(options.contexts, "context lengths", c.max_position - 1);
    OSPREY_CHECK(std::is_sorted(options.batches.begin(), options.batches.end()),
                 "batch sizes must be in ascending order");
    OSPREY_CHECK(options.steps >= 1 && options.steps <= 1000000, "--steps must be in [1, 1000000], got ",
                 options.steps);
    OSPREY_CHECK(options.warmup >= 0 && options.warmup <= 1000000, "--warmup must be in [0, 1000000], got ",
                 options.warmup);
    OSPREY_CHECK(options.chunk >= 1, "--chunk must be >= 1, got ", options.chunk);
    model::check_page_size(options.page_size, "--page-size");
    std::mt19937_64 rng(options.seed);
    DecodeResults results;
    for (int context : options.contexts) {
        // The batch sizes whose cache fits, in order; the rest are skipped and listed.
        DecodeOptions o = options;
        o.batches.clear();
        for (int batch : options.batches) {
            DecodeOptions trial = o;
            trial.batches.push_back(batch);
            const size_t need = decode_kv_bytes(runner, trial, context);
            if (need <= runner.kv_budget_bytes()) {
                o.batches.push_back(batch);
                continue;
            }
            results.skipped.push_back({context, batch, need, runner.kv_budget_bytes()});
            if (progress)
                progress(str("decode context ", context, " batch ", batch, ": skipped, its KV cache (--kv-fill ",
                             kv_fill_name(o.fill), ") needs ", need >> 20, " MiB, the backend offers ",
                             runner.kv_budget_bytes() >> 20, " MiB"));
        }
        OSPREY_CHECK(!o.batches.empty(), "decode at context ", context, " with batch ", options.batches.front(),
                     " (--kv-fill ", kv_fill_name(o.fill), ") needs ", results.skipped.back().kv_bytes_needed >> 20,
                     " MiB of KV cache, the backend offers ", runner.kv_budget_bytes() >> 20, " MiB",
                     o.fill == KvFill::shared ? "; try smaller batches" : "; try --kv-fill shared or smaller batches");
        const int max_batch = o.batches.back();
        const DecodePlan plan = plan_decode(o, context, runner.dp_groups());
        OSPREY_CHECK(int64_t(context) + plan.steps_total < c.max_position, "context ", context, " + ", plan.steps_total,
                     " decode steps exceeds the model's ", c.max_position, " positions");
        const auto t_fill = Clock::now();
        std::vector<Seq> seqs = fill_decode_cache(runner, o, context, rng());
        const double fill_s = seconds_since(t_fill);
        if (progress)
            progress(str("decode context ", context, ": cache filled for ", max_batch, " sequences in ", fill_s,
                         " s (--kv-fill ", kv_fill_name(o.fill), ")"));

        for (int batch : o.batches) {
            std::vector<double> times;
            double context_sum = 0;
            for (int step = 0; step < o.warmup + o.steps; ++step) {
                model::ForwardBatch b;
                double pos_sum = 0;
                for (int i = 0; i < batch; ++i) {
                    const Seq& s = seqs[size_t(i)];
                    model::SequenceSlice sl;
                    sl.first_token = i;
                    sl.n_tokens = 1;
                    sl.start_pos = s.pos;
                    sl.window_slot = s.slot;
                    sl.window_first = s.window_first;
                    sl.pages = s.pages;
                    sl.dp_group = s.dp_group;
                    b.slices.push_back(std::move(sl));
                    b.tokens.push_back(s.last);
                    pos_sum += s.pos + 1;  // the new token attends to pos + 1 rows
                }
                const auto t0 = Clock::now();
                runner.forward(b);
                const std::vector<int32_t> next = sample_greedy(runner, batch);
                const double sec = seconds_since(t0);
                for (int i = 0; i < batch; ++i) {
                    seqs[size_t(i)].pos += 1;
                    seqs[size_t(i)].last = next[size_t(i)];
                }
                if (step >= o.warmup) {
                    times.push_back(sec);
                    context_sum += pos_sum / batch;
                }
            }
            DecodeRow row;
            row.context = context;
            row.batch = batch;
            row.mean_context = context_sum / o.steps;
            row.kv_fill = kv_fill_name(o.fill);
            row.fill_s = fill_s;
            row.step_s = summarize(times);
            row.tokens_per_s_per_user = 1.0 / row.step_s.median;
            row.total_tokens_per_s = batch / row.step_s.median;
            row.cost_per_million_output = cost_per_million(price_per_hour, row.total_tokens_per_s);
            if (progress)
                progress(str("decode context ", context, " batch ", batch, ": step median ", row.step_s.median * 1e3,
                             " ms, p90 ", row.step_s.p90 * 1e3, " ms, ", row.tokens_per_s_per_user,
                             " tokens/s per user, ", row.total_tokens_per_s, " tokens/s total, $",
                             row.cost_per_million_output, " per M output tokens"));
            results.rows.push_back(std::move(row));
        }
    }
    return results;
}

}  // namespace osprey::benchtool
