// Runs a kernel's case table (harness.h) as parameterised GoogleTest tests, one test per case that is
// checked (the perf-only ones are left to the benchmark):
//
//   class cuda_rope_table : public cases::CaseTest {};
//   TEST_P(cuda_rope_table, matches_reference) { cases::check_case(GetParam()); }
//   INSTANTIATE_TEST_SUITE_P(cases, cuda_rope_table, cases::checked(rope::cases(), rope::run), cases::case_name);
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"

namespace osprey::cases {

class CaseTest : public ::testing::TestWithParam<Entry> {};

// The table's checked cases as gtest parameters.
template <typename Case>
auto checked(const std::vector<Case>& table, Result (*run)(const Case&, Mode)) {
    std::vector<Entry> out;
    for (Entry& e : entries(table, run))
        if (runs_in(e.use, Mode::check)) out.push_back(std::move(e));
    return ::testing::ValuesIn(out);
}

inline std::string case_name(const ::testing::TestParamInfo<Entry>& info) { return info.param.name; }

// The Result's failures as test failures; its notes printed; the seed recorded (replay it with
// OSPREY_TEST_SEED=<seed>).
inline void expect_passed(const Result& r) {
    ::testing::Test::RecordProperty("seed", std::to_string(r.seed));
    for (const std::string& n : r.notes) std::printf("  %s\n", n.c_str());
    for (const std::string& f : r.failures) ADD_FAILURE() << f;
}

inline void check_case(const Entry& e) { expect_passed(e.run(Mode::check)); }

}  // namespace osprey::cases
