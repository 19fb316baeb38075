// StepPlan -> ForwardBatch (see batch_builder.h).
#include "engine/batch_builder.h"

#include "core/check.h"

namespace osprey::engine {

bool batch_scores_prompt(const model::ForwardBatch& batch) {
    for (const auto& s : batch.slices)
        if (!s.score_targets.empty()) return true;
    return false;
}

void store_prompt_scores(std::span<const StepPlan> plans, std::vector<TokenScore>& scores) {
    size_t next = 0;
    for (const StepPlan& plan : plans)
        for (const ScheduledChunk& c : plan.chunks) {
            Sequence& seq = *c.seq;
            if (!seq.scores_prompt() || c.start_pos + 1 >= seq.n_prompt()) continue;
            seq.prompt_scores.resize(size_t(seq.n_prompt() - 1));
            for (int p = c.start_pos; p < c.start_pos + c.n_tokens && p + 1 < seq.n_prompt(); ++p) {
                OSPREY_CHECK(next < scores.size(), "the backend returned ", scores.size(), " prompt scores, too few");
                seq.prompt_scores[size_t(p)] = std::move(scores[next++]);
            }
        }
    OSPREY_CHECK(next == scores.size(), "the backend returned ", scores.size(), " prompt scores for ", next,
                 " scored positions");
}

model::ForwardBatch build_forward_batch(const StepPlan& plan) {
    return build_forward_batch(std::span(&plan, 1));
}

model::ForwardBatch build_forward_batch(std::span<const StepPlan> plans) {
    model::ForwardBatch batch;
    for (const StepPlan& plan : plans)
        for (const ScheduledChunk& c : plan.chunks) {
            model::SequenceSlice s;
            s.first_token = int32_t(batch.tokens.size());
            s.n_tokens = c.n_tokens;
            s.start_pos = c.start_pos;
            s.n_full_kv_cached = c.n_full_kv_cached;
            s.window_slot = c.seq->window_slot;
            s.window_first = c.window_first;
            s.pages = c.seq->pages;
            s.want_logits = c.want_logits;
            s.n_logits = 1 + c.n_draft;
            s.dp_group = plan.dp_group;
            // Prompt scoring: each prompt position's successor, up to the last prompt token (whose
            // successor is sampled, not scored).
            if (c.seq->scores_prompt() && c.start_pos + 1 < c.seq->n_prompt()) {
                s.score_top_k = c.seq->request->prompt_logprobs;
                s.score_targets.assign(size_t(c.n_tokens), -1);
                for (int i = 0; i < c.n_tokens && c.start_pos + i + 1 < c.seq->n_prompt(); ++i)
                    s.score_targets[size_t(i)] = c.seq->tokens[size_t(c.start_pos + i + 1)];
            }
            const int n_known = c.n_tokens - c.n_draft;  // the rest is the proposal
            batch.tokens.insert(batch.tokens.end(), c.seq->tokens.begin() + c.start_pos,
                                c.seq->tokens.begin() + c.start_pos + n_known);
            batch.tokens.insert(batch.tokens.end(), c.seq->draft.begin(), c.seq->draft.begin() + c.n_draft);
            batch.slices.push_back(std::move(s));
        }
    return batch;
}

void build_sampling_rows(const StepPlan& plan, std::vector<SamplingParams>& params,
                         std::vector<SamplingState>& states) {
    build_sampling_rows(std::span(&plan, 1), params, states);
}

void build_sampling_rows(std::span<const StepPlan> plans, std::vector<SamplingParams>& params,
                         std::vector<SamplingState>& states) {
    params.clear();
    states.clear();
    for (const StepPlan& plan : plans)
        for (const ScheduledChunk& c : plan.chunks) {
            if (!c.want_logits) continue;
            const Sequence& seq = *c.seq;
            // A verify chunk's row i samples the token after draft[0, i): its penalties see the
            // proposal as output, and it draws with that token's own output index (speculative.h).
            const int32_t* history = c.n_draft > 0 ? seq.verify_tokens.data() : seq.tokens.data();
            for (int i = 0; i <= c.n_draft; ++i) {
                params.push_back(seq.params);
                // min_tokens: the stop tokens cannot be drawn yet (a bias no logit survives).
                if (seq.n_output() + i < seq.request->min_tokens)
                    for (int32_t t : seq.request->stop_token_ids) params.back().logit_bias.emplace_back(t, -1e30f);
                SamplingState st;
                st.prompt_tokens = history;
                st.n_prompt_tokens = seq.n_prompt();
                st.output_tokens = history + seq.n_prompt();
                st.n_output_tokens = seq.n_output() + i;
                st.step = uint64_t(seq.n_output() + i);
                states.push_back(st);
            }
        }
}

}  // namespace osprey::engine
