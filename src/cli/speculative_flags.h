// Speculative-decoding flags shared by serve, generate --batch and bench decode
// (docs/speculative.md):
//   --speculative ngram|draft|eagle3   the proposer (default: off)
//   --num-speculative-tokens K         proposals per sequence and step (default 4)
//   --ngram-min N --ngram-max N        n-gram lookup sizes (default 1 and 4)
//   --draft-model DIR                  the draft checkpoint (any gpt-oss; the target's vocabulary)
//   --eagle3-model DIR                 an EAGLE-3 head
//   --forced-accept-len L              test mode: accept the first L proposals whatever the target says
//   --forced-accept-fraction F         test mode: accept each proposal with probability F
//   --spec-adaptive 0|1                propose only while acceptance pays at the batch size (default 1)
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/eagle3_proposer.h"
#include "backends/runner_factory.h"
#include "cli/command.h"
#include "core/check.h"
#include "engine/speculative.h"
#include "model/weights.h"

namespace osprey::cli {

inline const std::vector<std::string>& speculative_flag_names() {
    static const std::vector<std::string> names = {"speculative",    "num-speculative-tokens", "ngram-min",
                                                   "ngram-max",      "draft-model",            "eagle3-model",
                                                   "forced-accept-len", "forced-accept-fraction",
                                                   "spec-adaptive"};
    return names;
}

inline constexpr const char* kSpeculativeHelp =
    "  --speculative M        speculative decoding: ngram (prompt lookup), draft (a second gpt-oss\n"
    "                         checkpoint, --draft-model DIR) or eagle3 (--eagle3-model DIR); default off\n"
    "  --num-speculative-tokens K  tokens proposed per sequence and step (default 4)\n"
    "  --eagle3-model DIR     the EAGLE-3 head (osprey make-model --eagle3 writes a synthetic one)\n"
    "  --draft-model DIR      the draft checkpoint for --speculative draft\n"
    "  --ngram-min N, --ngram-max N  n-gram sizes the lookup tries, longest first (default 1, 4)\n"
    "  --forced-accept-len L, --forced-accept-fraction F  measuring on random weights: accept the first L\n"
    "                         proposals, or each with probability F, whatever the model says (NOT exact)\n"
    "  --spec-adaptive 0|1    1 (default): propose only while the batch's recent acceptance pays for the\n"
    "                         verify tokens at its size, else probe (docs/speculative.md); 0: every step\n";

// The draft model's runner (or the target's weights, whose embedding an EAGLE-3 head reads), kept
// alive beside the engine.
struct SpeculativeSetup {
    engine::SpeculativeOptions options;
    std::optional<backends::Runner> draft;
    std::optional<model::Weights> target_weights;
};

// --speculative eagle3: the head's proposer over `target` (call once the target runner exists).
// The target's embedding comes from its checkpoint in `target_dir` (mapped again, not copied).
inline void attach_eagle3(SpeculativeSetup& s, model::ModelRunner& target, const std::filesystem::path& target_dir) {
    if (s.options.method != engine::SpecMethod::eagle3) return;
    s.target_weights = model::Weights::load(target_dir);
    s.options.custom = backends::make_eagle3_proposer(s.options.eagle3_dir, target, &s.target_weights->embedding);
}

inline SpeculativeSetup speculative_flags(const Args& args, const backends::RunnerOptions& draft_runner_options) {
    SpeculativeSetup s;
    engine::SpeculativeOptions& o = s.options;
    o.method = engine::parse_spec_method(args.get("speculative", "none"));
    auto int_flag = [&](const char* name, int fallback) {
        const long long v = args.get_int(name, fallback);
        OSPREY_CHECK(v >= -1 && v <= 1 << 20, "--", name, " out of range: ", v);
        return int(v);
    };
    o.num_tokens = int_flag("num-speculative-tokens", o.num_tokens);
    o.ngram_min = int_flag("ngram-min", o.ngram_min);
    o.ngram_max = int_flag("ngram-max", std::max(o.ngram_max, o.ngram_min));
    o.forced_accept_len = int_flag("forced-accept-len", -1);
    o.forced_accept_fraction = args.get_double("forced-accept-fraction", -1.0);
    o.adaptive = int_flag("spec-adaptive", 1) != 0;
    if (!o.enabled()) {
        for (const std::string& f : speculative_flag_names())
            OSPREY_CHECK(f == "speculative" || !args.has(f), "--", f, " needs --speculative");
        return s;
    }
    if (o.method == engine::SpecMethod::draft) {
        OSPREY_CHECK(args.has("draft-model"), "--speculative draft needs --draft-model DIR");
        s.draft = backends::make_runner(model::Weights::load(args.get("draft-model")), draft_runner_options);
        o.draft_runner = s.draft->runner.get();
    }
    if (o.method == engine::SpecMethod::eagle3) {
        OSPREY_CHECK(args.has("eagle3-model"), "--speculative eagle3 needs --eagle3-model DIR");
        o.eagle3_dir = args.get("eagle3-model");
    }
    o.validate();
    return s;
}

}  // namespace osprey::cli
