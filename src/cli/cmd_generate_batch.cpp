// `osprey generate --batch N` (see generate_batch.h). Registers no command of its own.
#include <chrono>
#include <cstdio>

#include "cli/backend.h"
#include "cli/generate_batch.h"
#include "core/check.h"
#include "engine/engine.h"

namespace osprey::cli {

int run_generate_batch(const Args& args, model::ModelRunner& runner, const std::vector<int32_t>& prompt, int max_tokens,
                       bool stop_at_eos, const tok::Tokenizer* tokenizer) {
    const long long n = args.get_int("batch", 1);
    OSPREY_CHECK(n >= 1 && n <= 100000, "--batch must be in [1, 100000], got ", n);
    engine::EngineOptions o;
    o.kv_memory_fraction = args.get_double("kv-memory-fraction", o.kv_memory_fraction);
    o.max_batch_tokens = int(args.get_int("max-batch-tokens", o.max_batch_tokens));
    o.page_size = page_size_flag(args, o.page_size);
    OSPREY_CHECK(o.max_batch_tokens >= 1, "--max-batch-tokens must be >= 1, got ", o.max_batch_tokens);
    // Off by default: every request arrives at once and only throughput counts (serve defaults to 512).
    o.max_mixed_prefill_tokens = int(args.get_int("max-mixed-prefill-tokens", 0));
    OSPREY_CHECK(o.max_mixed_prefill_tokens == 0 || o.max_mixed_prefill_tokens >= engine::kPrefillChunkAlign,
                 "--max-mixed-prefill-tokens must be 0 (off) or >= ", engine::kPrefillChunkAlign, ", got ",
                 o.max_mixed_prefill_tokens);
    const std::string prefix_cache = args.get("prefix-cache", "on");
    OSPREY_CHECK(prefix_cache == "on" || prefix_cache == "off", "--prefix-cache must be on or off, got '",
                 prefix_cache, "'");
    o.enable_prefix_caching = prefix_cache == "on";
    const std::string prompts = args.get("prompts", "shared");
    OSPREY_CHECK(prompts == "shared" || prompts == "distinct", "--prompts must be shared or distinct, got '", prompts,
                 "'");
    const double temperature = args.get_double("temperature", 0.0);
    const long long seed = args.get_int("seed", 0);
    const long long n_samples = args.get_int("n", 1);
    OSPREY_CHECK(n_samples >= 1 && n_samples <= 128, "--n must be in [1, 128], got ", n_samples);
    o.max_num_seqs = int(args.get_int("max-num-seqs", std::min<long long>(n * n_samples, 256)));

    const std::string backend = runner.name().rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    SpeculativeSetup spec = speculative_flags(args, {.backend = backend, .max_logit_rows = 256});
    if (spec.options.method == engine::SpecMethod::eagle3) attach_eagle3(spec, runner, model_dir_flag(args));
    o.speculative = spec.options;

    engine::Engine eng(runner, o);
    const engine::KvPlan& kv = eng.kv_plan();
    std::printf(
        "engine: %s, KV cache %d pages x %d tokens = %lld tokens, %d window slots; window slots save %.1f MiB\n",
        runner.name().c_str(), kv.layout.n_pages, kv.layout.page_size(),
        (long long)kv.layout.n_pages * kv.layout.page_size(), kv.layout.n_window_slots,
        double(kv.window_saved_bytes) / (1024.0 * 1024.0));

    const int vocab = runner.config().vocab_size;
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    const auto t0 = std::chrono::steady_clock::now();
    for (long long i = 0; i < n; ++i) {
        engine::Request r;
        r.id = str("gen-", i);
        r.prompt = prompt;
        if (prompts == "distinct")
            for (int32_t& t : r.prompt) t = int32_t((uint64_t(t) + uint64_t(i)) % uint64_t(vocab));
        r.prompt.push_back(int32_t((uint64_t(i) * 7919u + 17u) % uint64_t(vocab)));
        r.max_new_tokens = max_tokens;
        r.n = int(n_samples);
        r.sampling.temperature = float(temperature);
        r.sampling.seed = uint64_t(seed) + uint64_t(i);
        if (stop_at_eos) r.stop_token_ids = {runner.config().eos_token_id};
        streams.push_back(eng.submit(std::move(r)));
    }
    std::vector<double> first_token_s(size_t(n), -1.0);
    std::vector<std::vector<int32_t>> outputs(static_cast<size_t>(n));
    long long n_generated = 0;
    long long n_before_decode = 0;  // tokens generated until every request had its first token
    double decode_start_s = -1.0;   // when the last request got its first token
    long long n_started = 0;
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    int n_errors = 0;
    for (bool more = true; more;) {
        more = eng.step();
        for (size_t i = 0; i < streams.size(); ++i) {
            while (auto e = streams[i]->try_pop()) {
                if (e->kind == engine::Event::Kind::token) {
                    if (first_token_s[i] < 0) {
                        first_token_s[i] = elapsed();
                        if (++n_started == n) {
                            decode_start_s = first_token_s[i];
                            n_before_decode = n_generated + 1;
                        }
                    }
                    if (e->sample == 0) outputs[i].push_back(e->token);  // printed: sample 0
                    ++n_generated;
                } else if (e->reason == engine::FinishReason::error) {
                    ++n_errors;
                    std::fprintf(stderr, "request %zu failed: %s\n", i, e->error.c_str());
                }
            }
        }
    }
    const double wall = elapsed();
    for (size_t i = 0; i < outputs.size() && i < 4; ++i) {
        std::printf("request %zu:", i);
        for (size_t t = 0; t < outputs[i].size(); ++t) std::printf("%s%d", t ? "," : " ", outputs[i][t]);
        std::printf("\n");
        if (tokenizer) std::printf("  text: %s\n", tokenizer->decode_bytes(outputs[i]).c_str());
    }
    if (outputs.size() > 4) std::printf("... (%zu more)\n", outputs.size() - 4);
    double ttft = 0;
    for (double t : first_token_s) ttft += t > 0 ? t : 0;
    const engine::EngineStats st = eng.stats();
    std::printf("batch: %lld requests x %lld samples, %zu prompt tokens each, %lld tokens generated in %.3f s\n", n,
                n_samples, prompt.size() + 1, n_generated, wall);
    std::printf("throughput: %.1f generated tokens/s, %.2f requests/s, mean time to first token %.3f s\n",
                double(n_generated) / wall, double(n) / wall, ttft / double(n));
    if (decode_start_s >= 0 && wall > decode_start_s)
        std::printf("decode: %.1f tokens/s over %lld tokens after the last first token (%.1f tokens/s per sample)\n",
                    double(n_generated - n_before_decode) / (wall - decode_start_s), n_generated - n_before_decode,
                    double(n_generated - n_before_decode) / (wall - decode_start_s) / double(n * n_samples));
    std::printf(
        "engine: %llu steps, %llu prefill tokens, %llu prefix-hit tokens, %llu forked tokens, %llu preemptions\n",
        (unsigned long long)st.n_steps, (unsigned long long)st.n_prefill_tokens,
        (unsigned long long)st.n_prefix_hit_tokens, (unsigned long long)st.n_forked_tokens,
        (unsigned long long)st.n_preemptions);
    if (o.speculative.enabled() && st.n_spec_verifies > 0)
        std::printf("speculative (%s): %llu verifies, %llu proposed, %llu accepted (%.1f%%), mean accepted length %.3f\n",
                    st.spec_method.c_str(), (unsigned long long)st.n_spec_verifies,
                    (unsigned long long)st.n_spec_draft_tokens, (unsigned long long)st.n_spec_accepted_tokens,
                    100.0 * double(st.n_spec_accepted_tokens) / double(std::max<uint64_t>(1, st.n_spec_draft_tokens)),
                    double(st.n_spec_verifies + st.n_spec_accepted_tokens) / double(st.n_spec_verifies));
    return n_errors == 0 ? 0 : 1;
}

}  // namespace osprey::cli
