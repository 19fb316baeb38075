// Subcommands of the `osprey` executable. Each lives in its own cmd_<name>.cpp and registers itself:
//   OSPREY_COMMAND(generate, "run the model on a prompt", run_generate);
// The executable is built from every cmd_*.cpp in this folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::cli {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;  // args after the name

struct Command {
    std::string name;
    std::string summary;
    CommandFn run;
};

std::vector<Command>& registry();
bool register_command(Command c);

// The whole input of a command that reads one FILE argument: the file, or standard input when
// `positional` is empty or "-". Throws osprey::Error naming an unreadable file or extra arguments.
std::string read_file_or_stdin(const std::vector<std::string>& positional);

// `text` as a whole base-10 integer in std::stoll's syntax (leading spaces and a sign allowed), or
// nullopt when it is empty, has anything after the number, or is out of range.
std::optional<long long> parse_integer(const std::string& text);

// A small flag parser: --name value, --name=value and boolean --flag. Unknown flags are errors
// naming the flag. Positional arguments are kept in order.
class Args {
public:
    Args(const std::vector<std::string>& args, std::vector<std::string> value_flags,
         std::vector<std::string> bool_flags = {});
    bool has(std::string_view flag) const;
    std::string get(std::string_view flag, std::string_view fallback = "") const;
    long long get_int(std::string_view flag, long long fallback) const;
    double get_double(std::string_view flag, double fallback) const;
    const std::vector<std::string>& positional() const { return positional_; }

private:
    std::vector<std::pair<std::string, std::string>> values_;
    std::vector<std::string> positional_;
};

// The checkpoint writers' common flags (make-model, convert): --max-shard-mb (default 4800, > 0) as
// bytes and --threads (default 0: all cores, at most 1024). Throws osprey::Error naming a bad value.
struct WriterFlags {
    uint64_t max_shard_bytes = 0;
    int threads = 0;
};
WriterFlags writer_flags(const Args& args);

}  // namespace osprey::cli

#define OSPREY_COMMAND(name, summary, fn) \
    static const bool osprey_command_registered_##name = ::osprey::cli::register_command({#name, summary, fn})
