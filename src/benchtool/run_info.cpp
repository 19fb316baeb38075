#include "benchtool/run_info.h"

#include <unistd.h>

#include <ctime>
#include <fstream>

#include "core/check.h"

#ifndef OSPREY_GIT_DESCRIBE
#define OSPREY_GIT_DESCRIBE "unknown"
#endif

namespace osprey::benchtool {

std::string build_commit() {
    const std::string c = OSPREY_GIT_DESCRIBE;
    return c.empty() ? "unknown" : c;
}

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string name = line.substr(colon + 1);
        while (!name.empty() && name.front() == ' ') name.erase(name.begin());
        if (!name.empty()) return name;
    }
    return "unknown CPU";
}

std::string utc_now_iso() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

double cost_per_million(double price_per_hour, double tokens_per_s) {
    if (!(tokens_per_s > 0)) return 0.0;  // nothing measured
    return price_per_hour / 3600.0 / tokens_per_s * 1e6;
}

RunInfo RunInfo::now(std::string command) {
    RunInfo r;
    r.command = std::move(command);
    r.commit = build_commit();
    r.date = utc_now_iso();
    char host[256] = {};
    r.host = ::gethostname(host, sizeof host - 1) == 0 ? host : "unknown";
    return r;
}

json::Value RunInfo::to_json() const {
    json::Value v = json::Object{};
    v.set("command", command);
    v.set("commit", commit);
    v.set("date", date);
    v.set("host", host);
    v.set("device", device);
    v.set("backend", backend);
    v.set("checkpoint", checkpoint);
    v.set("checkpoint_layout", checkpoint_layout);
    v.set("model", model);
    v.set("weight_format", weight_format);
    json::Value l = json::Object{};
    l.set("tp", layout.tp);
    l.set("ep", layout.ep);
    l.set("dp", layout.dp);
    l.set("n_gpus", layout.n_gpus());
    l.set("label", layout.label());
    v.set("layout", std::move(l));
    v.set("price_per_gpu_hour_usd", price_per_gpu_hour);
    v.set("price_per_hour_usd", price_per_hour());
    return v;
}

}  // namespace osprey::benchtool
