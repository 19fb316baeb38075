// Sharded checkpoints: model.safetensors.index.json or every *.safetensors of a folder.
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "io_test_util.h"

namespace osprey::io {
namespace {

using test::expect_error;
using test::ScratchDir;

void shard(const std::filesystem::path& p, const std::vector<std::string>& names, uint8_t value) {
    std::vector<TensorSpec> specs;
    for (const auto& n : names) specs.push_back({n, DType::bf16, {2, 3}});
    write_safetensors(p, specs, {{"format", "pt"}}, [value](size_t t, uint64_t, uint8_t* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = uint8_t(value + t);
    });
}

const char* kIndex = R"({"metadata": {"total_size": 36},
  "weight_map": {"a": "model-00000-of-00001.safetensors", "b": "model-00000-of-00001.safetensors",
                 "c": "model-00001-of-00001.safetensors"}})";

struct Sharded {
    ScratchDir dir{"ckpt_sharded"};
    Sharded() {
        shard(dir / "model-00000-of-00001.safetensors", {"a", "b"}, 10);
        shard(dir / "model-00001-of-00001.safetensors", {"c"}, 20);
    }
};

TEST(checkpoint, index_resolves_tensors_across_shards) {
    Sharded s;
    test::write_file(s.dir / "model.safetensors.index.json", kIndex);
    auto c = Checkpoint::open_dir(s.dir.path);
    EXPECT_EQ(c->n_tensors(), 3u);
    EXPECT_EQ(c->files().size(), 2u);
    EXPECT_EQ(c->names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(static_cast<const uint8_t*>(c->at("c").data)[0], 20);
    EXPECT_EQ(static_cast<const uint8_t*>(c->at("b").data)[0], 11);
    EXPECT_EQ(c->file_of("c").filename(), "model-00001-of-00001.safetensors");
    EXPECT_EQ(c->data_bytes(), 36u);
    expect_error([&] { c->at("zzz"); }, {"zzz: missing from"});
}

TEST(checkpoint, folder_without_index_opens_every_safetensors_file) {
    Sharded s;
    auto c = Checkpoint::open_dir(s.dir.path);
    EXPECT_EQ(c->n_tensors(), 3u);
}

TEST(checkpoint, index_naming_a_missing_shard) {
    Sharded s;
    test::write_file(s.dir / "model.safetensors.index.json",
                     R"({"weight_map": {"a": "model-00000-of-00001.safetensors", "x": "gone.safetensors"}})");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"lists shard 'gone.safetensors', which does not exist"});
}

TEST(checkpoint, index_and_shards_disagree) {
    Sharded s;
    test::write_file(s.dir / "model.safetensors.index.json",
                     R"({"weight_map": {"a": "model-00000-of-00001.safetensors", "b": "model-00000-of-00001.safetensors",
                         "c": "model-00000-of-00001.safetensors", "d": "model-00001-of-00001.safetensors"}})");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"tensor 'c' is listed in model-00000-of-00001.safetensors",
                                                             "found in model-00001-of-00001.safetensors"});
    test::write_file(s.dir / "model.safetensors.index.json",
                     R"({"weight_map": {"a": "model-00000-of-00001.safetensors", "c": "model-00001-of-00001.safetensors"}})");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"tensor 'b'", "is not listed in weight_map"});
}

TEST(checkpoint, malformed_index) {
    Sharded s;
    test::write_file(s.dir / "model.safetensors.index.json", R"({"weight_map": )");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"model.safetensors.index.json", "invalid JSON"});
    test::write_file(s.dir / "model.safetensors.index.json", R"({"metadata": {}})");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"missing object 'weight_map'"});
    test::write_file(s.dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../etc/passwd"}})");
    expect_error([&] { Checkpoint::open_dir(s.dir.path); }, {"is not a file name in the same folder"});
}

TEST(checkpoint, duplicate_tensor_in_two_files) {
    ScratchDir dir("ckpt_dup");
    shard(dir / "x.safetensors", {"a"}, 1);
    shard(dir / "y.safetensors", {"a"}, 2);
    expect_error([&] { Checkpoint::open_dir(dir.path); }, {"tensor 'a' occurs in both", "x.safetensors", "y.safetensors"});
}

TEST(checkpoint, empty_folder) {
    ScratchDir dir("ckpt_empty");
    expect_error([&] { Checkpoint::open_dir(dir.path); }, {"no model.safetensors.index.json and no *.safetensors"});
    expect_error([&] { Checkpoint::open_dir(dir / "nope"); }, {"not a directory"});
}

}  // namespace
}  // namespace osprey::io
