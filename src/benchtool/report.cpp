#include "benchtool/report.h"

#include "core/file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace osprey::benchtool {

json::Value make_report(const RunInfo& run, json::Value settings, json::Value results) {
    json::Value v = json::Object{};
    v.set("osprey_bench", kReportVersion);
    v.set("run", run.to_json());
    v.set("settings", std::move(settings));
    v.set("results", std::move(results));
    return v;
}

void check_report(const json::Value& report) {
    OSPREY_CHECK(report.is_object(), "a bench report is a JSON object, got ", json::type_name(report.type()));
    const json::Value* version = report.find("osprey_bench");
    OSPREY_CHECK(version && version->is_integer() && version->as_int() == kReportVersion,
                 "not an osprey bench report (no \"osprey_bench\": ", kReportVersion, ")");
    for (const char* key : {"run", "settings"})
        OSPREY_CHECK(report.find(key) && report.at(key).is_object(), "bench report: \"", key, "\" must be an object");
    OSPREY_CHECK(report.find("results") && report.at("results").is_array(), "bench report: \"results\" must be an array");
    const json::Value& run = report.at("run");
    for (const char* key : {"command", "commit", "date", "device", "model", "weight_format", "checkpoint"})
        OSPREY_CHECK(run.find(key) && run.at(key).is_string(), "bench report: run.", key, " must be a string");
    OSPREY_CHECK(run.find("layout") && run.at("layout").find("label") && run.at("layout").at("label").is_string(),
                 "bench report: run.layout.label must be a string");
}

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

std::string markdown_run_info(const RunInfo& run) {
    std::ostringstream o;
    o << "- command: `osprey bench " << run.command << "`\n"
      << "- date: " << run.date << "\n"
      << "- commit: `" << run.commit << "`\n"
      << "- device: " << run.device << " (backend " << run.backend << ", host " << run.host << ")\n"
      << "- layout: " << run.layout.label() << " (TP " << run.layout.tp << ", EP " << run.layout.ep << ", DP "
      << run.layout.dp << ", " << run.layout.n_gpus() << " GPU" << (run.layout.n_gpus() > 1 ? "s" : "") << ")\n"
      << "- model: " << run.model << "\n"
      << "- checkpoint: `" << run.checkpoint << "`"
      << (run.checkpoint_layout.empty() ? "" : " (" + run.checkpoint_layout + " layout)") << "\n"
      << "- weight format: " << run.weight_format << "\n"
      << "- price: $" << fixed(run.price_per_gpu_hour, 2) << " per GPU-hour, $" << fixed(run.price_per_hour(), 2)
      << " per hour for this layout\n";
    return o.str();
}

std::string markdown_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    std::string out = "|";
    for (const auto& h : header) out += " " + h + " |";
    out += "\n|";
    for (size_t i = 0; i < header.size(); ++i) out += i == 0 ? " --- |" : " ---: |";
    out += "\n";
    for (const auto& r : rows) {
        OSPREY_CHECK(r.size() == header.size(), "markdown table row has ", r.size(), " cells for ", header.size(),
                     " columns");
        out += "|";
        for (const auto& cell : r) out += " " + cell + " |";
        out += "\n";
    }
    return out;
}

void write_text_file(const std::string& path, const std::string& text) {
    write_file(path, text);
}

}  // namespace osprey::benchtool
