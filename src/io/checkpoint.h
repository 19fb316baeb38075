// A checkpoint spread over one or more safetensors shards, with one name -> tensor index.
// Opened from a folder: through model.safetensors.index.json ("weight_map": {tensor: file}) when
// present (every tensor must live in the file the index names, and every listed file must exist),
// otherwise every *.safetensors in the folder (as OpenAI's loader does). A tensor name that occurs
// in two shards is an error naming both files.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace osprey::io {

class Checkpoint {
public:
    static std::shared_ptr<const Checkpoint> open_dir(const std::filesystem::path& dir);
    static std::shared_ptr<const Checkpoint> open_index(const std::filesystem::path& index_json);
    static std::shared_ptr<const Checkpoint> open_files(const std::vector<std::filesystem::path>& files);

    const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
    const TensorView* find(std::string_view name) const;  // nullptr when absent
    // The tensor or an Error "<name>: missing from <dir>".
    const TensorView& at(std::string_view name) const;
    // Which file holds `name` (for messages); empty path when absent.
    std::filesystem::path file_of(std::string_view name) const;
    std::vector<std::string> names() const;  // every tensor name, sorted
    size_t n_tensors() const { return index_.size(); }
    size_t data_bytes() const;  // all shards' data sections
    const std::filesystem::path& dir() const { return dir_; }

private:
    void add(std::shared_ptr<const SafetensorsFile> f);
    std::filesystem::path dir_;
    std::vector<std::shared_ptr<const SafetensorsFile>> files_;
    struct Where {
        size_t file;
        const TensorView* view;
    };
    std::unordered_map<std::string_view, Where> index_;
};

}  // namespace osprey::io
