// `osprey bench prefill|decode|serve|plot` end to end on the CPU backend with the built-in tiny
// model and tiny settings: the JSON reports' structure, the markdown tables, the charts (PNG read
// back by an independent checker, and by python's zlib when python3 is present), option errors,
// and `bench serve` against a real `osprey serve` on a free loopback port. No timing asserts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "benchtool/http_client.h"
#include "benchtool/report.h"
#include "core/json.h"
#include "png_check.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

struct CliRun {
    int rc = -1;
    std::string out;  // stdout and stderr
};

// Runs `osprey <args>` with the test's cache folder; returns exit status and output.
CliRun osprey_run(const std::string& args, const fs::path& dir) {
    const std::string cmd = "cd '" + dir.string() + "' && OSPREY_CACHE='" + (dir / "cache").string() + "' '" +
                            OSPREY_EXE + "' " + args + " 2>&1";
    CliRun r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

class BenchCli : public ::testing::Test {
protected:
    static fs::path dir() {
        static const fs::path d = [] {
            const fs::path p = fs::temp_directory_path() / ("osprey-bench-cli-" + std::to_string(::getpid()));
            fs::remove_all(p);
            fs::create_directories(p);
            return p;
        }();
        return d;
    }
    static void TearDownTestSuite() { fs::remove_all(dir()); }
    // The tiny-tp preset (8 KV heads) in dir()/tiny-tp, written once per process.
    static void make_tiny_tp() {
        if (fs::exists(dir() / "tiny-tp" / "config.json")) return;
        const CliRun made = osprey_run("make-model --preset tiny-tp --out tiny-tp --threads 1", dir());
        ASSERT_EQ(made.rc, 0) << made.out;
    }

    // Runs a bench command that must succeed and returns its parsed, structure-checked report.
    static json::Value report_of(const std::string& args, const std::string& prefix) {
        const CliRun r = osprey_run(args + " --out " + prefix, dir());
        EXPECT_EQ(r.rc, 0) << r.out;
        const json::Value v = json::parse(slurp(dir() / (prefix + ".json")));
        benchtool::check_report(v);
        return v;
    }
};

void expect_summary(const json::Value& s, int n) {
    EXPECT_EQ(s.at("n").as_int(), n);
    for (const char* k : {"mean", "median", "p90", "p99", "min", "max"}) EXPECT_TRUE(s.at(k).is_number()) << k;
    EXPECT_LE(s.at("min").as_double(), s.at("median").as_double());
    EXPECT_LE(s.at("median").as_double(), s.at("p90").as_double());
    EXPECT_LE(s.at("p90").as_double(), s.at("max").as_double());
}

void expect_run_info(const json::Value& run, const std::string& command) {
    EXPECT_EQ(run.at("command").as_string(), command);
    EXPECT_FALSE(run.at("commit").as_string().empty());
    EXPECT_EQ(run.at("date").as_string().size(), 20u);  // 2026-11-29T10:24:18Z
    EXPECT_EQ(run.at("layout").at("tp").as_int(), 1);
    EXPECT_EQ(run.at("layout").at("n_gpus").as_int(), 1);
    EXPECT_EQ(run.at("layout").at("label").as_string(), "TP1");
    EXPECT_DOUBLE_EQ(run.at("price_per_gpu_hour_usd").as_double(), 2.5);
}

TEST_F(BenchCli, PrefillWritesJsonAndMarkdown) {
    const json::Value v = report_of("bench prefill --backend cpu --lengths 8,40 --repeats 2 --warmup 1 --gpu-price 2.5 "
                                    "--chunk 16 --threads 1",
                                    "prefill");
    expect_run_info(v.at("run"), "prefill");
    EXPECT_EQ(v.at("run").at("backend").as_string(), "cpu");
    EXPECT_NE(v.at("run").at("weight_format").as_string().find("MXFP4"), std::string::npos);
    EXPECT_EQ(v.at("run").at("checkpoint_layout").as_string(), "hf");
    EXPECT_EQ(v.at("settings").at("batch").as_int(), 1);
    // `osprey --version` names the commit the reports record.
    const CliRun version = osprey_run("--version", dir());
    EXPECT_EQ(version.rc, 0);
    EXPECT_EQ(version.out, "osprey " + v.at("run").at("commit").as_string() + "\n");
    const auto& rows = v.at("results").as_array();
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].at("prompt_tokens").as_int(), 8);
    EXPECT_EQ(rows[1].at("prompt_tokens").as_int(), 40);
    for (const auto& r : rows) {
        expect_summary(r.at("ttft_s"), 2);
        const double tps = r.at("input_tokens_per_s").as_double();
        EXPECT_GT(tps, 0);
        // cost = price per hour / 3600 / tokens per s * 1e6
        EXPECT_NEAR(r.at("cost_per_million_input_usd").as_double(), 2.5 / 3600 / tps * 1e6, 1e-9 * (1 + 1e6 / tps));
    }
    const std::string md = slurp(dir() / "prefill.md");
    EXPECT_NE(md.find("# osprey bench prefill"), std::string::npos);
    EXPECT_NE(md.find("| prompt tokens | TTFT median (ms) | TTFT p90 (ms) | input tokens/s | USD / M input tokens |"),
              std::string::npos);
    EXPECT_NE(md.find("\n| 8 | "), std::string::npos);
    EXPECT_NE(md.find("\n| 40 | "), std::string::npos);
    EXPECT_NE(md.find("- layout: TP1"), std::string::npos);
}

TEST_F(BenchCli, DecodeSweepsBatchesAndContextsWithEveryFill) {
    for (const char* fill_name : {"prefill", "copy", "shared"}) {
        const std::string fill = fill_name;
        // Context 40 is not a multiple of the page size (shared pages plus a private tail).
        const json::Value v = report_of("bench decode --backend cpu --batches 1,2 --contexts 40,64 --steps 2 --warmup 1 "
                                        "--gpu-price 2.5 --page-size 16 --chunk 32 --threads 1 --kv-fill " + fill,
                                        "decode-" + fill);
        expect_run_info(v.at("run"), "decode");
        EXPECT_EQ(v.at("settings").at("kv_fill").as_string(), fill);
        EXPECT_TRUE(v.at("skipped").as_array().empty());  // everything fits the CPU budget
        const auto& rows = v.at("results").as_array();
        ASSERT_EQ(rows.size(), 4u);
        const int expect[4][2] = {{40, 1}, {40, 2}, {64, 1}, {64, 2}};
        for (size_t i = 0; i < 4; ++i) {
            const json::Value& r = rows[i];
            EXPECT_EQ(r.at("context").as_int(), expect[i][0]);
            EXPECT_EQ(r.at("batch").as_int(), expect[i][1]);
            EXPECT_EQ(r.at("kv_fill").as_string(), fill);
            expect_summary(r.at("step_s"), 2);
            // Every timed step attends over at least the requested context.
            EXPECT_GT(r.at("mean_context").as_double(), expect[i][0]);
            const double per_user = r.at("tokens_per_s_per_user").as_double();
            EXPECT_NEAR(r.at("total_tokens_per_s").as_double(), per_user * expect[i][1], 1e-6 * per_user * 2);
            EXPECT_GT(r.at("cost_per_million_output_usd").as_double(), 0);
        }
        const std::string md = slurp(dir() / ("decode-" + fill + ".md"));
        EXPECT_NE(md.find("| context | batch | mean context | step median (ms) | step p90 (ms) | tokens/s per user | "
                          "total tokens/s | USD / M output tokens |"),
                  std::string::npos);
        EXPECT_NE(md.find("\n| 64 | 2 | "), std::string::npos);
        EXPECT_NE(md.find("--kv-fill " + fill), std::string::npos);
    }
}

// The parallel layouts end to end on the CPU backend: a model with 8 KV heads (preset tiny-tp), the
// layout and its GPU count in every report, and the cost computed for that many GPUs.
TEST_F(BenchCli, ParallelLayoutsRunAndAreRecorded) {
    make_tiny_tp();
    struct Case {
        const char* flags;
        const char* label;
        int n_gpus;
    };
    for (const Case& c : {Case{"--tp 2", "TP2", 2}, Case{"--tp 4 --ep 4", "TP4 EP4", 4}, Case{"--ep 2", "TP1 EP2", 2},
                          Case{"--dp 2", "TP1 DP2", 2}, Case{"--ep 2 --dp 2", "TP1 EP2 DP2", 4}}) {
        std::string name = std::string("par-") + std::to_string(c.n_gpus) + "-" + c.label;
        std::replace(name.begin(), name.end(), ' ', '-');
        const json::Value p =
            report_of(std::string("bench prefill --model tiny-tp --backend cpu --lengths 20 --repeats 1 "
                                  "--warmup 0 --gpu-price 2.5 --threads 2 ") +
                          c.flags,
                      name + "-prefill");
        const json::Value d =
            report_of(std::string("bench decode --model tiny-tp --backend cpu --batches 2 --contexts 24 "
                                  "--steps 2 --warmup 0 --gpu-price 2.5 --page-size 16 --threads 2 ") +
                          c.flags,
                      name + "-decode");
        for (const json::Value* v : {&p, &d}) {
            const json::Value& run = v->at("run");
            EXPECT_EQ(run.at("layout").at("label").as_string(), c.label);
            EXPECT_EQ(run.at("layout").at("n_gpus").as_int(), c.n_gpus);
            EXPECT_DOUBLE_EQ(run.at("price_per_hour_usd").as_double(), 2.5 * c.n_gpus);
            EXPECT_NE(run.at("device").as_string().find(c.label), std::string::npos) << run.at("device").as_string();
        }
        const json::Value& row = p.at("results").as_array().at(0);
        const double tps = row.at("input_tokens_per_s").as_double();
        EXPECT_NEAR(row.at("cost_per_million_input_usd").as_double(), 2.5 * c.n_gpus / 3600 / tps * 1e6,
                    1e-9 * (1 + 1e6 / tps));
        const json::Value& drow = d.at("results").as_array().at(0);
        EXPECT_NEAR(drow.at("cost_per_million_output_usd").as_double(),
                    2.5 * c.n_gpus / 3600 / drow.at("total_tokens_per_s").as_double() * 1e6,
                    1e-6 * drow.at("cost_per_million_output_usd").as_double());
    }
}

TEST_F(BenchCli, PlotDrawsValidPngAndSvg) {
    report_of("bench prefill --backend cpu --lengths 8,16 --repeats 1 --warmup 0 --threads 1", "plot-prefill");
    report_of("bench decode --backend cpu --batches 1,2 --contexts 32 --steps 1 --warmup 0 --threads 1", "plot-decode");
    const CliRun r = osprey_run("bench plot plot-prefill.json plot-decode.json --out charts --width 700 --height 450", dir());
    ASSERT_EQ(r.rc, 0) << r.out;
    for (const char* name_c : {"decode", "prefill"}) {
        const std::string name = name_c;
        const std::string png = slurp(dir() / "charts" / (name + ".png"));
        const test::DecodedPng d = test::check_and_decode_png(std::vector<uint8_t>(png.begin(), png.end()));
        EXPECT_EQ(d.width, 700);
        EXPECT_EQ(d.height, 450);
        const std::string svg = slurp(dir() / "charts" / (name + ".svg"));
        EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
        EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
        EXPECT_NE(svg.find("</svg>"), std::string::npos);
        EXPECT_NE(svg.find(name == "decode" ? "TP1 ctx 32" : "TP1"), std::string::npos);
    }
    // python's zlib, when there is a python3, agrees with our own reader.
    if (std::system("python3 -c 'import zlib' > /dev/null 2>&1") == 0) {
        const std::string script =
            "import struct, sys, zlib\n"
            "d = open(sys.argv[1], 'rb').read()\n"
            "assert d[:8] == b'\\x89PNG\\r\\n\\x1a\\n'\n"
            "i, idat = 8, b''\n"
            "while i < len(d):\n"
            "    n, t = struct.unpack('>I4s', d[i:i + 8])\n"
            "    body = d[i + 8:i + 8 + n]\n"
            "    assert struct.unpack('>I', d[i + 8 + n:i + 12 + n])[0] == zlib.crc32(t + body), t\n"
            "    if t == b'IHDR': w, h = struct.unpack('>II', body[:8])\n"
            "    if t == b'IDAT': idat += body\n"
            "    i += 12 + n\n"
            "raw = zlib.decompress(idat)\n"
            "assert len(raw) == h * (3 * w + 1), (len(raw), w, h)\n"
            "print('ok', w, h)\n";
        std::ofstream(dir() / "check_png.py") << script;
        const std::string cmd = "cd '" + dir().string() + "' && python3 check_png.py charts/decode.png 2>&1";
        FILE* p = ::popen(cmd.c_str(), "r");
        ASSERT_NE(p, nullptr);
        char buf[256] = {};
        const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
        EXPECT_EQ(::pclose(p), 0) << std::string(buf, n);
        EXPECT_EQ(std::string(buf, n), "ok 700 450\n");
    }
}

TEST_F(BenchCli, BadOptionsGetClearErrors) {
    struct Case {
        const char* args;
        const char* message;
    };
    const Case cases[] = {
        {"bench prefill --backend cpu --tp 2", "--tp 2: the model's 1 KV heads do not split"},
        {"bench decode --backend cpu --ep 3", "--ep 3: the model's 8 experts do not split evenly"},
        {"bench decode --tp 2 --ep 3", "must divide one another"},
        {"bench decode --dp 0", "--dp must be in [1, 1024]"},
        {"serve --tp 0", "--tp must be in [1, 1024]"},
        // One bound for every command and the engine (model/kv_spec.h); checked before the model loads.
        {"bench decode --page-size 2048", "--page-size must be in [1, 1024] tokens, got 2048"},
        {"bench prefill --page-size 0", "--page-size must be in [1, 1024] tokens, got 0"},
        {"serve --page-size 2048", "--page-size must be in [1, 1024] tokens, got 2048"},
        {"generate --prompt-ids 1,2 --batch 2 --page-size 4096", "--page-size must be in [1, 1024] tokens, got 4096"},
        {"bench decode --kv-fill share", "--kv-fill must be 'prefill', 'copy' or 'shared', got 'share'"},
        {"bench decode --batches 1,x", "--batches: 'x' is not a positive integer"},
        {"bench decode --batches 4,2", "ascending"},
        {"bench prefill --lengths 0", "--lengths: '0' is not a positive integer"},
        {"bench prefill --gpu-price -1", "--gpu-price must be in"},
        {"bench prefill --frobnicate 1", "unknown option --frobnicate"},
        {"bench nonsense", "unknown bench command 'nonsense'"},
        {"bench plot", "needs one or more report files"},
        {"bench plot missing.json", "cannot read missing.json"},
        {"bench serve --url https://x --served-model m", "https is not supported"},
        {"bench serve --endpoint responses --served-model m",
         "--endpoint must be 'chat' or 'completions', got 'responses'"},
    };
    for (const Case& c : cases) {
        const CliRun r = osprey_run(c.args, dir());
        EXPECT_NE(r.rc, 0) << c.args;
        EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    }
    std::ofstream(dir() / "not-a-report.json") << "{\"hello\": 1}";
    const CliRun r = osprey_run("bench plot not-a-report.json", dir());
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("not an osprey bench report"), std::string::npos) << r.out;
}

// `osprey serve` with the tiny model on a free port, stopped at the end of the test.
class ServeProcess {
public:
    explicit ServeProcess(const fs::path& dir, std::vector<std::string> extra = {},
                          const std::string& log = "serve.log")
        : log_(dir / log) {
        pid_ = ::fork();
        if (pid_ == 0) {
            const std::string cache = (dir / "cache").string();
            ::setenv("OSPREY_CACHE", cache.c_str(), 1);
            std::freopen(log_.c_str(), "w", stdout);
            ::dup2(::fileno(stdout), 2);
            const std::string tok = std::string(OSPREY_SHARED_DIR) + "/data/o200k_base.tiktoken";
            std::vector<std::string> args = {OSPREY_EXE,    "serve", "--port",         "0", "--backend",         "cpu",
                                             "--threads",   "1",     "--max-num-seqs", "4", "--kv-cache-tokens", "8192",
                                             "--tokenizer", tok};
            args.insert(args.end(), extra.begin(), extra.end());
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execv(OSPREY_EXE, argv.data());
            std::_Exit(127);
        }
        for (int i = 0; i < 1200 && url_.empty(); ++i) {  // up to 60 s (the first run writes the tiny model)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const std::string text = slurp(log_);
            const size_t at = text.find("listening on http://");
            if (at != std::string::npos) {
                const size_t end = text.find_first_of(" \n", at + 13);
                url_ = text.substr(at + 13, end - at - 13);
            }
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                break;
            }
        }
    }
    ~ServeProcess() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        int status = 0;
        for (int i = 0; i < 200; ++i) {  // 10 s to shut down, then SIGKILL
            if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
    }
    const std::string& url() const { return url_; }
    std::string log() const { return slurp(log_); }

private:
    fs::path log_;
    pid_t pid_ = -1;
    std::string url_;
};

TEST_F(BenchCli, ServeAgainstARealOspreyServe) {
    if (!fs::exists(fs::path(OSPREY_SHARED_DIR) / "data" / "o200k_base.tiktoken"))
        GTEST_SKIP() << "no o200k_base.tiktoken under OSPREY_SHARED_DIR: osprey serve needs it";
    if (osprey_run("serve --help", dir()).rc != 0) GTEST_SKIP() << "this osprey has no serve command";
    const ServeProcess server(dir());
    ASSERT_FALSE(server.url().empty()) << server.log();
    const json::Value v = report_of("bench serve --url " + server.url() +
                                        " --concurrency 1,2 --requests 3 --input-len 12 --output-len 6 --gpu-price 2.5",
                                    "serve");
    expect_run_info(v.at("run"), "serve");
    EXPECT_EQ(v.at("run").at("backend").as_string(), "http");
    EXPECT_EQ(v.at("run").at("device").as_string(), server.url());
    const auto& rows = v.at("results").as_array();
    ASSERT_EQ(rows.size(), 2u);
    for (size_t i = 0; i < rows.size(); ++i) {
        const json::Value& r = rows[i];
        EXPECT_EQ(r.at("concurrency").as_int(), int(i) + 1);
        EXPECT_EQ(r.at("ok").as_int(), 3) << r.dump();
        EXPECT_EQ(r.at("failed").as_int(), 0);
        EXPECT_EQ(r.at("token_counts").as_string(), "server usage");
        EXPECT_GT(r.at("mean_output_tokens").as_double(), 0);
        EXPECT_LE(r.at("mean_output_tokens").as_double(), 4 * 6);
        for (const char* k : {"ttft_s", "e2e_s"}) expect_summary(r.at(k), 3);
        for (const char* k : {"itl_s", "tpot_s"}) EXPECT_TRUE(r.at(k).at("median").is_number());
        EXPECT_GT(r.at("output_tokens_per_s").as_double(), 0);
        EXPECT_TRUE(r.at("cost_per_million_output_usd").is_number());
    }
    const std::string md = slurp(dir() / "serve.md");
    EXPECT_NE(md.find("| concurrency | ok/failed | req/s | output tokens/s | TTFT median (ms) |"), std::string::npos);
    EXPECT_NE(md.find("\n| 2 | 3/0 | "), std::string::npos);
    EXPECT_NE(md.find("/v1/chat/completions"), std::string::npos);

    // Raw-text completions: every request's tokens stream one by one (the random tiny model never
    // writes a Harmony header, so only this endpoint shows its per-token pace).
    const json::Value c = report_of("bench serve --endpoint completions --url " + server.url() +
                                        " --concurrency 2 --requests 4 --input-len 12 --output-len 8 --len-sigma 0",
                                    "serve-completions");
    EXPECT_EQ(c.at("settings").at("endpoint").as_string(), "completions");
    const json::Value& row = c.at("results").as_array().at(0);
    EXPECT_EQ(row.at("ok").as_int(), 4) << row.dump();
    EXPECT_EQ(row.at("token_counts").as_string(), "server usage");
    EXPECT_GT(row.at("mean_output_tokens").as_double(), 1);
    EXPECT_LE(row.at("mean_output_tokens").as_double(), 8);
    EXPECT_GT(row.at("tpot_s").at("median").as_double(), 0);  // tokens arrived one after another
    EXPECT_NE(slurp(dir() / "serve-completions.md").find("/v1/completions (raw text)"), std::string::npos);

    // A shared 80-word prefix, one request at a time: the second request hits the prefix cache and
    // saves its rebuilt window ring, the later ones restore it (the server's /metrics count both).
    auto metric = [&](const std::string& name) {
        const benchtool::HttpResponse m =
            benchtool::http_request(benchtool::parse_url(server.url()), "GET", "/metrics", {}, "");
        const size_t at = m.body.find("\n" + name + " ");
        return at == std::string::npos ? -1.0 : std::stod(m.body.substr(at + name.size() + 2));
    };
    const double restores_before = metric("osprey_window_restores_total");
    ASSERT_GE(restores_before, 0) << "no osprey_window_restores_total in /metrics";
    const json::Value pr = report_of("bench serve --endpoint completions --url " + server.url() +
                                         " --concurrency 1 --requests 5 --prefix-len 80 --input-len 6 --output-len 3"
                                         " --len-sigma 0",
                                     "serve-prefix");
    EXPECT_EQ(pr.at("settings").at("prefix_len").as_int(), 80);
    EXPECT_EQ(pr.at("results").as_array().at(0).at("ok").as_int(), 5);
    // The report carries the server's counter deltas for the level.
    const json::Value& sc = pr.at("results").as_array().at(0).at("server_counters");
    EXPECT_GE(sc.at("osprey_window_restores_total").as_double(), 3);
    EXPECT_GT(sc.at("osprey_prefix_cache_hits_total").as_double(), 0);
    EXPECT_NE(slurp(dir() / "serve-prefix.md").find("osprey_window_restores_total +"), std::string::npos);
    EXPECT_GE(metric("osprey_window_restores_total") - restores_before, 3) << "requests 3-5 restore the saved ring";
    EXPECT_GT(metric("osprey_prefix_cache_hits_total"), 0);
    EXPECT_NE(slurp(dir() / "serve-prefix.md").find("prompts 80 shared words + ~6 words"), std::string::npos);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// `osprey serve --tp 2 --ep 2` (2 ranks, one thread each) answering `bench serve` end to end.
TEST_F(BenchCli, ServeWithAParallelLayout) {
    if (!fs::exists(fs::path(OSPREY_SHARED_DIR) / "data" / "o200k_base.tiktoken"))
        GTEST_SKIP() << "no o200k_base.tiktoken under OSPREY_SHARED_DIR: osprey serve needs it";
    make_tiny_tp();
    const ServeProcess server(dir(), {"--model", (dir() / "tiny-tp").string(), "--tp", "2", "--ep", "2"},
                              "serve-parallel.log");
    ASSERT_FALSE(server.url().empty()) << server.log();
    EXPECT_NE(server.log().find("cpu-reference TP2 EP2 (2 ranks)"), std::string::npos) << server.log();
    const json::Value v = report_of("bench serve --endpoint completions --url " + server.url() +
                                        " --concurrency 2 --requests 3 --input-len 12 --output-len 6 --tp 2 --ep 2",
                                    "serve-parallel");
    EXPECT_EQ(v.at("run").at("layout").at("label").as_string(), "TP2 EP2");
    EXPECT_EQ(v.at("run").at("layout").at("n_gpus").as_int(), 2);
    const json::Value& r = v.at("results").as_array().at(0);
    EXPECT_EQ(r.at("ok").as_int(), 3) << r.dump();
    EXPECT_EQ(r.at("failed").as_int(), 0);
    EXPECT_GT(r.at("mean_output_tokens").as_double(), 0);
}

// --dp 2 with EP2 through the server: two groups' caches, requests routed between them.
TEST_F(BenchCli, ServeWithDataParallelism) {
    if (!fs::exists(fs::path(OSPREY_SHARED_DIR) / "data" / "o200k_base.tiktoken"))
        GTEST_SKIP() << "no o200k_base.tiktoken under OSPREY_SHARED_DIR: osprey serve needs it";
    make_tiny_tp();
    const ServeProcess server(dir(), {"--model", (dir() / "tiny-tp").string(), "--ep", "2", "--dp", "2"},
                              "serve-dp.log");
    ASSERT_FALSE(server.url().empty()) << server.log();
    EXPECT_NE(server.log().find("cpu-reference TP1 EP2 DP2 (4 ranks)"), std::string::npos) << server.log();
    EXPECT_NE(server.log().find("2 data-parallel groups"), std::string::npos) << server.log();
    const json::Value v = report_of("bench serve --endpoint completions --url " + server.url() +
                                        " --concurrency 3 --requests 5 --input-len 12 --output-len 6 --ep 2 --dp 2",
                                    "serve-dp");
    EXPECT_EQ(v.at("run").at("layout").at("label").as_string(), "TP1 EP2 DP2");
    EXPECT_EQ(v.at("run").at("layout").at("n_gpus").as_int(), 4);
    const json::Value& r = v.at("results").as_array().at(0);
    EXPECT_EQ(r.at("ok").as_int(), 5) << r.dump();
    EXPECT_EQ(r.at("failed").as_int(), 0);
    EXPECT_GT(r.at("mean_output_tokens").as_double(), 0);
}

}  // namespace
}  // namespace osprey
