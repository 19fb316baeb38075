// Token constraints through the engine on the fake model: each sample clones the request's
// constraint, its masks apply to greedy and sampled rows, it advances with every generated token, a
// step without a mask changes nothing, and unconstrained requests in the same batch are unaffected.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine_test_util.h"

using namespace osprey;
using namespace osprey::engine;

namespace {

// Allows exactly one token per step: the sequence `script`, free once it runs out.
class ScriptConstraint : public TokenConstraint {
public:
    explicit ScriptConstraint(std::vector<int32_t> script) : script_(std::move(script)) {}
    std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<ScriptConstraint>(*this); }
    bool fill_mask(std::span<uint32_t> mask) override {
        if (pos_ >= script_.size()) return false;
        const int32_t t = script_[pos_];
        mask[size_t(t) / 32] |= uint32_t(1) << (t % 32);
        return true;
    }
    bool accept(int32_t token) override {
        if (pos_ >= script_.size()) return true;
        return token == script_[pos_++];
    }

private:
    std::vector<int32_t> script_;
    size_t pos_ = 0;
};

EngineOptions options() {
    EngineOptions o;
    o.page_size = 8;
    o.max_num_seqs = 8;
    o.max_batch_tokens = 64;
    o.check_invariants = true;
    return o;
}

std::vector<int32_t> prompt_of(int n, int seed) {
    std::mt19937 rng{uint32_t(seed)};
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = int32_t(rng() % 384);
    return p;
}

TEST(engine_constraint, masks_force_greedy_and_sampled_rows) {
    test::FakeRunner runner;
    Engine engine(runner, options());
    const std::vector<int32_t> script = {5, 300, 7, 7, 42};
    Request r;
    r.prompt = prompt_of(30, 1);
    r.max_new_tokens = 8;
    r.n = 3;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 9;
    r.constraint = std::make_shared<ScriptConstraint>(script);
    Request greedy;
    greedy.prompt = prompt_of(30, 1);
    greedy.max_new_tokens = 8;
    greedy.sampling.temperature = 0.0f;
    greedy.constraint = r.constraint;
    Request free;  // same batch, unconstrained
    free.prompt = prompt_of(30, 1);
    free.max_new_tokens = 8;
    free.sampling.temperature = 0.0f;
    auto s = engine.submit(r);
    auto g = engine.submit(greedy);
    auto f = engine.submit(free);
    engine.run_until_idle();
    for (const auto& out : test::collect(*s)) {
        ASSERT_EQ(out.tokens.size(), 8u);
        EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 5), script);
    }
    const auto go = test::collect(*g);
    EXPECT_EQ(std::vector<int32_t>(go[0].tokens.begin(), go[0].tokens.begin() + 5), script);
    // After the script the constraint is free: greedy continues as the model would from there.
    std::vector<int32_t> history = greedy.prompt;
    history.insert(history.end(), script.begin(), script.end());
    const auto rest = test::greedy_oracle(history, 3, {}, 384, 128);
    EXPECT_EQ(std::vector<int32_t>(go[0].tokens.begin() + 5, go[0].tokens.end()), rest);
    EXPECT_EQ(test::collect(*f)[0].tokens, test::greedy_oracle(free.prompt, 8, {}, 384, 128));
}

TEST(engine_constraint, an_empty_mask_lets_the_sample_stop) {
    // A constraint that allows nothing (a dead end): the engine allows the stop tokens instead.
    class Nothing : public TokenConstraint {
    public:
        std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<Nothing>(); }
        bool fill_mask(std::span<uint32_t>) override { return true; }
        bool accept(int32_t) override { return true; }
    };
    test::FakeRunner runner;
    Engine engine(runner, options());
    Request r;
    r.prompt = prompt_of(10, 2);
    r.max_new_tokens = 5;
    r.stop_token_ids = {17};
    r.constraint = std::make_shared<Nothing>();
    auto s = engine.submit(r);
    engine.run_until_idle();
    const auto out = test::collect(*s);
    EXPECT_TRUE(out[0].tokens.empty());
    EXPECT_EQ(out[0].finish.reason, FinishReason::stop);
    EXPECT_EQ(out[0].finish.stop_token, 17);
}

}  // namespace
