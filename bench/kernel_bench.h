// The command line of the kernel benchmarks (bench_attention, bench_linear, bench_moe, bench_sampling,
// bench_rmsnorm, bench_rope): each runs its kernel's case tables (tests/kernels/cases/*_cases.h, the
// same tables the gpu tests check) in perf mode.
//
//   bench_<kernel> [--filter REGEX] [--iters N] [--json FILE] [--list] [--check]
//                  [--hbm-gbps X] [--bf16-tflops X] [--fp8-tflops X]
//
//   --filter REGEX  only the cases whose name (as --list prints it) matches (ECMAScript, searched)
//   --iters N       timed runs per figure (default per case: 50, 10 for the largest MoE batches, 30 for
//                   the sampler); a bare number N means the same (bench_sampling's old usage)
//   --json FILE     also write every figure as JSON: [{"kernel", "case", "label", "us", "bytes", "flops",
//                   "gbps", "tflops", "hbm_fraction", "compute_fraction"}, ...]
//   --list          list the cases (name and mode) and exit
//   --check         run the checked cases against the CPU reference instead of timing (the gtest
//                   binaries do the same; this needs no GoogleTest on the device)
//   --hbm-gbps X    the bandwidth ceiling for the fractions (default 4640: H200 read-only streaming;
//                   4300 reproduces the fractions printed before the tables)
//   --bf16-tflops X, --fp8-tflops X   the compute ceilings (default 790, 1470)
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <regex>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"

namespace osprey::bench {

struct Table {
    const char* kernel;  // "attention", "moe_mlp", ...
    std::vector<cases::Entry> entries;
};

inline std::string json_escape(const std::string& s) {
    std::string o;
    for (char ch : s) {
        if (ch == '"' || ch == '\\') {
            o += '\\', o += ch;
        } else if (ch == '\n') {
            o += "\\n";
        } else {
            o += ch;
        }
    }
    return o;
}

inline int usage(const char* binary, int rc) {
    std::fprintf(rc ? stderr : stdout,
                 "usage: %s [--filter REGEX] [--iters N] [--json FILE] [--list] [--check]\n"
                 "          [--hbm-gbps X] [--bf16-tflops X] [--fp8-tflops X]   (see bench/kernel_bench.h)\n",
                 binary);
    return rc;
}

// Parses the flags above and runs the tables' cases in order; returns the process exit code (1 when a
// case failed its check or threw).
inline int main(int argc, char** argv, const char* binary, const std::vector<Table>& tables) {
    std::string filter, json;
    bool list = false, check = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s: %s needs a value\n", binary, arg.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (arg == "--filter") {
            filter = value();
        } else if (arg == "--iters") {
            cases::perf_options().iters = std::atoi(value().c_str());
        } else if (arg == "--json") {
            json = value();
        } else if (arg == "--list") {
            list = true;
        } else if (arg == "--check") {
            check = true;
        } else if (arg == "--hbm-gbps") {
            cases::ceilings().hbm_gbps = std::atof(value().c_str());
        } else if (arg == "--bf16-tflops") {
            cases::ceilings().bf16_tflops = std::atof(value().c_str());
        } else if (arg == "--fp8-tflops") {
            cases::ceilings().fp8_tflops = std::atof(value().c_str());
        } else if (arg == "-h" || arg == "--help") {
            return usage(binary, 0);
        } else if (!arg.empty() && arg.find_first_not_of("0123456789") == std::string::npos) {
            cases::perf_options().iters = std::atoi(arg.c_str());
        } else {
            std::fprintf(stderr, "%s: unknown argument '%s'\n", binary, arg.c_str());
            return usage(binary, 2);
        }
    }
    const std::regex re(filter.empty() ? std::string(".") : filter);
    const cases::Mode mode = check ? cases::Mode::check : cases::Mode::perf;
    auto selected = [&](const cases::Entry& e) { return std::regex_search(e.name, re); };

    if (list) {
        for (const Table& t : tables)
            for (const cases::Entry& e : t.entries) {
                if (!selected(e)) continue;
                const char* use = e.use == cases::Use::both         ? "check+perf"
                                  : e.use == cases::Use::check_only ? "check"
                                                                    : "perf";
                std::printf("%-12s %-10s %s\n", t.kernel, use, e.name.c_str());
            }
        return 0;
    }

    const cases::Ceilings& c = cases::ceilings();
    std::printf("%s on %s (%s; ceilings: %.0f GB/s, %.0f TFLOP/s BF16, %.0f TFLOP/s FP8)\n", binary,
                cuda::device_name().c_str(), check ? "check mode" : "perf mode, median of timed runs", c.hbm_gbps,
                c.bf16_tflops, c.fp8_tflops);
    int failures = 0, n_run = 0;
    std::vector<std::string> last_notes;
    std::string out = "[";
    for (const Table& t : tables)
        for (const cases::Entry& e : t.entries) {
            if (!selected(e) || !cases::runs_in(e.use, mode)) continue;
            ++n_run;
            cases::Result r;
            try {
                r = e.run(mode);
            } catch (const std::exception& ex) {
                std::printf("ERROR %s: %s\n", e.name.c_str(), ex.what());
                ++failures;
                continue;
            }
            if (check) {
                std::printf("%s %s (seed %u)\n", r.ok() ? "PASS" : "FAIL", e.name.c_str(), r.seed);
                for (const std::string& n : r.notes) std::printf("    %s\n", n.c_str());
                for (const std::string& f : r.failures) std::printf("    %s\n", f.c_str());
                failures += !r.ok();
                continue;
            }
            // Notes (section headers) are printed when they change from the previous case's.
            for (const std::string& n : r.notes)
                if (std::find(last_notes.begin(), last_notes.end(), n) == last_notes.end())
                    std::printf("%s\n", n.c_str());
            last_notes = r.notes;
            for (const cases::Timing& tm : r.timings) {
                cases::print_timing(tm);
                const double gbps = tm.bytes / (tm.us * 1e3), tflops = tm.flops / (tm.us * 1e6);
                const double peak = tm.math == cases::Math::fp8 ? c.fp8_tflops : c.bf16_tflops;
                char buf[512];
                std::snprintf(
                    buf, sizeof buf,
                    "%s\n  {\"kernel\": \"%s\", \"case\": \"%s\", \"label\": \"%s\", \"us\": %.3f, \"bytes\": %.0f, "
                    "\"flops\": %.0f, \"gbps\": %.2f, \"tflops\": %.3f, \"hbm_fraction\": %.4f, "
                    "\"compute_fraction\": %.4f}",
                    out.size() > 1 ? "," : "", t.kernel, e.name.c_str(), json_escape(tm.label).c_str(), tm.us, tm.bytes,
                    tm.flops, gbps, tflops, gbps / c.hbm_gbps, tflops / peak);
                out += buf;
            }
            std::fflush(stdout);
        }
    out += "\n]\n";
    if (check) std::printf("%d of %d checked cases failed\n", failures, n_run);
    if (n_run == 0) std::printf("no case matched\n");
    if (!json.empty()) {
        FILE* f = std::fopen(json.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "%s: cannot write %s\n", binary, json.c_str());
            return 1;
        }
        std::fputs(out.c_str(), f);
        std::fclose(f);
    }
    return failures ? 1 : 0;
}

}  // namespace osprey::bench
