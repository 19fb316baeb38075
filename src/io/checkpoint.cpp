#include "io/checkpoint.h"

#include <algorithm>
#include <set>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"

namespace osprey::io {

namespace fs = std::filesystem;

void Checkpoint::add(std::shared_ptr<const SafetensorsFile> f) {
    const size_t file_index = files_.size();
    files_.push_back(f);
    for (const TensorView& v : f->tensors()) {
        auto [it, inserted] = index_.emplace(v.name, Where{file_index, &v});
        OSPREY_CHECK(inserted, "tensor '", v.name, "' occurs in both ", files_[it->second.file]->path().string(),
                     " and ", f->path().string());
    }
}

std::shared_ptr<const Checkpoint> Checkpoint::open_files(const std::vector<fs::path>& files) {
    OSPREY_CHECK(!files.empty(), "no safetensors files to open");
    auto c = std::make_shared<Checkpoint>();
    c->dir_ = files.front().parent_path();
    for (const fs::path& p : files) c->add(SafetensorsFile::open(p));
    return c;
}

std::shared_ptr<const Checkpoint> Checkpoint::open_index(const fs::path& index_json) {
    const std::string what = index_json.string();
    json::Value root;
    try {
        root = json::parse(read_file(index_json));
    } catch (const Error& e) {
        OSPREY_FAIL(what, ": ", e.what());
    }
    OSPREY_CHECK(root.is_object(), what, ": must be a JSON object");
    const json::Value* map = root.find("weight_map");
    OSPREY_CHECK(map != nullptr && map->is_object(), what, ": missing object 'weight_map'");
    OSPREY_CHECK(map->size() > 0, what, ": 'weight_map' is empty");

    // Files in first-mention order; each name must resolve to a plain file name in the same folder.
    std::vector<std::string> file_names;
    for (const auto& [tensor, file] : map->as_object()) {
        OSPREY_CHECK(file.is_string(), what, ": weight_map['", tensor, "'] must be a file name string");
        const std::string& f = file.as_string();
        OSPREY_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", what,
                     ": weight_map['", tensor, "'] = '", f, "' is not a file name in the same folder");
        if (std::find(file_names.begin(), file_names.end(), f) == file_names.end()) file_names.push_back(f);
    }
    auto c = std::make_shared<Checkpoint>();
    c->dir_ = index_json.parent_path();
    for (const std::string& f : file_names) {
        const fs::path p = c->dir_ / f;
        OSPREY_CHECK(fs::is_regular_file(p), what, ": lists shard '", f, "', which does not exist");
        c->add(SafetensorsFile::open(p));
    }
    // The index and the shards must agree in both directions.
    for (const auto& [tensor, file] : map->as_object()) {
        auto it = c->index_.find(tensor);
        OSPREY_CHECK(it != c->index_.end(), what, ": tensor '", tensor, "' is listed in ", file.as_string(),
                     " but that file does not contain it");
        const std::string actual = c->files_[it->second.file]->path().filename().string();
        OSPREY_CHECK(actual == file.as_string(), what, ": tensor '", tensor, "' is listed in ", file.as_string(),
                     " but found in ", actual);
    }
    for (const auto& [name, where] : c->index_) {
        OSPREY_CHECK(map->find(name) != nullptr, what, ": tensor '", name, "' in ",
                     c->files_[where.file]->path().filename().string(), " is not listed in weight_map");
    }
    return c;
}

std::shared_ptr<const Checkpoint> Checkpoint::open_dir(const fs::path& dir) {
    OSPREY_CHECK(fs::is_directory(dir), dir.string(), ": not a directory");
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::is_regular_file(index)) return open_index(index);
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir))
        if (entry.is_regular_file() && entry.path().extension() == ".safetensors") files.push_back(entry.path());
    OSPREY_CHECK(!files.empty(), dir.string(), ": no model.safetensors.index.json and no *.safetensors files");
    std::sort(files.begin(), files.end());
    auto c = open_files(files);
    return c;
}

const TensorView* Checkpoint::find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second.view;
}

const TensorView& Checkpoint::at(std::string_view name) const {
    const TensorView* v = find(name);
    OSPREY_CHECK(v != nullptr, name, ": missing from ", dir_.string());
    return *v;
}

fs::path Checkpoint::file_of(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? fs::path() : files_[it->second.file]->path();
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    out.reserve(index_.size());
    for (const auto& [name, where] : index_) out.emplace_back(name);
    std::sort(out.begin(), out.end());
    return out;
}

size_t Checkpoint::data_bytes() const {
    size_t n = 0;
    for (const auto& f : files_) n += f->data_bytes();
    return n;
}

}  // namespace osprey::io
