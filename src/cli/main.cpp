// The `osprey` executable: dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>

#include "benchtool/run_info.h"
#include "cli/command.h"
#include "core/check.h"

namespace osprey::cli {

std::vector<Command>& registry() {
    static std::vector<Command> commands;
    return commands;
}

bool register_command(Command c) {
    registry().push_back(std::move(c));
    return true;
}

std::string read_file_or_stdin(const std::vector<std::string>& positional) {
    OSPREY_CHECK(positional.size() <= 1, "expected at most one input file, got ", positional.size(), " arguments");
    std::ostringstream ss;
    if (positional.empty() || positional[0] == "-") {
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream in(positional[0], std::ios::binary);
    OSPREY_CHECK(in.good(), "cannot open ", positional[0]);
    ss << in.rdbuf();
    return ss.str();
}

Args::Args(const std::vector<std::string>& args, std::vector<std::string> value_flags,
           std::vector<std::string> bool_flags) {
    auto known = [](const std::vector<std::string>& list, const std::string& f) {
        return std::find(list.begin(), list.end(), f) != list.end();
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a.rfind("--", 0) != 0 || a == "--") {
            positional_.push_back(a);
            continue;
        }
        std::string name = a.substr(2), value;
        const size_t eq = name.find('=');
        const bool has_eq = eq != std::string::npos;
        if (has_eq) {
            value = name.substr(eq + 1);
            name = name.substr(0, eq);
        }
        if (known(bool_flags, name)) {
            OSPREY_CHECK(!has_eq || value == "true" || value == "false", "--", name, " takes no value");
            if (!has_eq || value == "true") values_.emplace_back(name, "true");
            continue;
        }
        OSPREY_CHECK(known(value_flags, name), "unknown option --", name);
        if (!has_eq) {
            OSPREY_CHECK(i + 1 < args.size(), "option --", name, " needs a value");
            value = args[++i];
        }
        values_.emplace_back(name, value);
    }
}

bool Args::has(std::string_view flag) const {
    return std::any_of(values_.begin(), values_.end(), [&](const auto& kv) { return kv.first == flag; });
}

std::string Args::get(std::string_view flag, std::string_view fallback) const {
    for (auto it = values_.rbegin(); it != values_.rend(); ++it)
        if (it->first == flag) return it->second;
    return std::string(fallback);
}

std::optional<long long> parse_integer(const std::string& text) {
    size_t used = 0;
    long long x = 0;
    try {
        x = std::stoll(text, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (used != text.size()) return std::nullopt;
    return x;
}

long long Args::get_int(std::string_view flag, long long fallback) const {
    if (!has(flag)) return fallback;
    const std::string v = get(flag);
    const std::optional<long long> x = parse_integer(v);
    OSPREY_CHECK(x.has_value(), "--", flag, " expects an integer, got '", v, "'");
    return *x;
}

double Args::get_double(std::string_view flag, double fallback) const {
    if (!has(flag)) return fallback;
    const std::string v = get(flag);
    size_t used = 0;
    double x = 0;
    try {
        x = std::stod(v, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    OSPREY_CHECK(used == v.size() && !v.empty(), "--", flag, " expects a number, got '", v, "'");
    return x;
}

WriterFlags writer_flags(const Args& args) {
    const long long shard_mb = args.get_int("max-shard-mb", 4800);
    OSPREY_CHECK(shard_mb > 0, "--max-shard-mb must be > 0, got ", shard_mb);
    const long long threads = args.get_int("threads", 0);
    OSPREY_CHECK(threads >= 0 && threads <= 1024, "--threads must be in [0, 1024], got ", threads);
    return {.max_shard_bytes = uint64_t(shard_mb) * 1000000ull, .threads = int(threads)};
}

}  // namespace osprey::cli

namespace {
// To stdout when asked for (--help, as every subcommand's --help), to stderr after a mistake.
void usage(std::FILE* out) {
    std::fprintf(out, "usage: osprey <command> [options]\n\ncommands:\n");
    auto commands = osprey::cli::registry();
    std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (const auto& c : commands) std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
    std::fprintf(out, "\n`osprey <command> --help` describes a command's options; `osprey --version` the build.\n");
}
}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const std::string name = argv[1];
    if (name == "--version" || name == "-V") {  // the commit benchmark reports record
        std::printf("osprey %s\n", osprey::benchtool::build_commit().c_str());
        return 0;
    }
    for (const auto& c : osprey::cli::registry()) {
        if (c.name != name) continue;
        try {
            return c.run(std::vector<std::string>(argv + 2, argv + argc));
        } catch (const osprey::Error& e) {
            std::fprintf(stderr, "osprey %s: error: %s\n", name.c_str(), e.what());
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "osprey %s: internal error: %s\n", name.c_str(), e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "osprey: unknown command '%s'\n\n", name.c_str());
    usage(stderr);
    return 2;
}
