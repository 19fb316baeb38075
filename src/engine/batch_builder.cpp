// StepPlan -> ForwardBatch (see batch_builder.h).
#include "engine/batch_builder.h"

namespace osprey::engine {

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
