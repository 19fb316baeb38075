// Benchmark reports: one JSON document per run ({"osprey_bench": 1, "run", "settings", "results"})
// and a markdown page (the run's metadata as a list, then the results table).
#pragma once

#include <string>
#include <vector>

#include "benchtool/run_info.h"
#include "core/json.h"

namespace osprey::benchtool {

constexpr int kReportVersion = 1;

json::Value make_report(const RunInfo& run, json::Value settings, json::Value results);
// Checks a parsed report's top-level structure; throws naming the missing or mistyped field.
void check_report(const json::Value& report);

std::string markdown_run_info(const RunInfo& run);
std::string markdown_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
std::string fixed(double v, int decimals);  // "12.35"

void write_text_file(const std::string& path, const std::string& text);

}  // namespace osprey::benchtool
