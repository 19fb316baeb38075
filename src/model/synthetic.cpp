// Synthetic gpt-oss checkpoints.
//
// Initialisation scheme (all scales in SyntheticInit; "RMS r" = uniform noise with that RMS):
//   Random weights make a chaotic model (docs/architecture.md, "Comparing implementations on random
//   weights"), so the synthetic model is built to be well-conditioned:
//   - Embedding: every entry is ±embed_scale (a random sign pattern; exact in BF16). The residual
//     stream starts with RMS embed_scale and rows of different tokens are nearly orthogonal.
//   - Unembedding: row v is (top_logit / H) * sign(embedding row sigma(v)), with sigma(v) = (a v + b)
//     mod vocab a seed-dependent permutation. For a residual state close to token t's embedding, the
//     logit of v = sigma^-1(t) is ~top_logit while every other logit is ~N(0, top_logit/sqrt(H)):
//     the next-token distribution is peaked with a wide top-1/top-2 margin, and the greedy
//     continuation of t is known in advance (synthetic_next_token).
//   - Each layer's updates are small relative to the residual stream: q/k/v weights have RMS
//     1/sqrt(H) (so q, k, v have RMS ~1 and attention logits a moderate spread), the output
//     projection has RMS attn_update*embed_scale/sqrt(q_dim) so the attention update has RMS
//     ~attn_update of the residual; likewise the expert down projection for mlp_update.
//   - Router with token-dependent routing and clear margins: each token has a routing class c(t)
//     (one of m = route_code_dims classes); the first m embedding dims of t are Hadamard row c(t)
//     (still ±embed_scale, so exactly orthogonal between classes). For each layer, every class gets a
//     set S_c of top_k experts (disjoint groups of a per-layer, per-round permutation, so all experts
//     are used and load is balanced), and router row e on the code dims is
//     (router_class_logit / m) * sum_{c : e in S_c} Hadamard row c. An unperturbed token's router
//     logits are then router_class_logit for S_c(t) and 0 elsewhere, plus biases uniform in
//     ±router_bias_jitter and a token-dependent part of RMS router_noise from the other dims: the
//     top_k-th / next gap is ~router_class_logit - 2 jitter, far above the layer-to-layer drift.
//   - Experts (MXFP4): nibbles are uniformly random bytes (FP4 values up to ±6, RMS 2.93); each
//     block's scale is a per-tensor base exponent jittered by -1/0/+1, the base chosen so the
//     dequantised weights have RMS ~1/sqrt(H) (gate_up) and mlp_update*embed_scale/sqrt(d_ff) (down).
//   - Norm gains are 1 + small noise; sinks uniform in ±sink_scale; biases small (see the struct).
//   Measured with the CPU reference on the tiny preset (seed 1, one 300-token prompt): each sub-layer
//   update is 2-5% of the residual RMS (attention ~2%, MoE ~3.5%), the residual RMS stays 1.00, the
//   router's top_k-th/next gap is >= 2.0 for every token and layer, and the last token's top-1/top-2
//   logit gap is 11.6 with the greedy token = synthetic_next_token. (Tokens of one routing class share
//   m of the H embedding dims, which costs ~top_logit*m/H of that margin: 2.5 logits on tiny.)
// Every value is a pure function of (seed, logical tensor, layer, element index) (splitmix64), so
// chunks are generated in parallel, in any order, and the HF and original layouts of a seed are the
// same model (the original fused qkv rows come from the same streams as HF q/k/v).
#include "model/synthetic.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>

#include "core/bf16.h"
#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "core/log.h"
#include "io/safetensors_writer.h"

namespace osprey::model {

namespace fs = std::filesystem;

namespace {

// ---- presets (one table) ------------------------------------------------------------------------

struct Preset {
    const char* name;
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, n_experts, top_k, d_ff;
};
constexpr Preset kPresets[] = {
    {"tiny", 4, 128, 8, 1, 64, 8, 4, 128},
    // tiny with gpt-oss's 8 KV heads, so tensor parallelism runs up to TP 8 on the CPU backend; an
    // expert intermediate of 6 MXFP4 groups (uneven over 4 ranks, empty on some of 8).
    {"tiny-tp", 4, 128, 16, 8, 64, 8, 4, 192},
    {"20b", 24, 2880, 64, 8, 64, 32, 4, 2880},
    {"120b", 36, 2880, 64, 8, 64, 128, 4, 2880},
};

// ---- counter-based random numbers ---------------------------------------------------------------

inline uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline uint64_t bits(uint64_t key, uint64_t index) { return mix64(key ^ mix64(index)); }

// Uniform in [-1, 1) with 24 random bits.
inline float uniform(uint64_t key, uint64_t index) {
    return float(int64_t(bits(key, index) >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));
}

constexpr float kSqrt3 = 1.7320508f;
constexpr float kFp4Rms = 2.9261749f;       // RMS of the 16 FP4 values, uniformly drawn
constexpr float kScaleJitterRms = 1.3228757f;  // sqrt(mean(4^-1, 4^0, 4^1)) for exponent jitter -1/0/+1
constexpr float kSwigluOutRms = 1.0f;       // rough RMS of the clamped SwiGLU output for RMS-1 inputs

// Logical tensors (layout-independent); the stream key depends on (seed, role, layer).
enum class Role : uint32_t {
    embedding = 1, unembedding, final_norm, attn_norm, q_w, q_b, k_w, k_b, v_w, v_b, sinks, out_w, out_b,
    mlp_norm, router_w, router_b, mlp1_blocks, mlp1_scales, mlp1_bias, mlp2_blocks, mlp2_scales, mlp2_bias,
    qkv_w, qkv_b,  // original layout: rows dispatch to q/k/v
};
constexpr uint32_t kRoles = uint32_t(Role::qkv_b) + 1;

uint64_t stream_key(uint64_t seed, Role role, int layer) {
    return mix64(mix64(seed ^ 0x6f737072657921ull) ^ (uint64_t(role) << 32) ^ uint64_t(uint32_t(layer)));
}

int64_t gcd64(int64_t a, int64_t b) { return b == 0 ? a : gcd64(b, a % b); }

// The unembedding permutation sigma(v) = (a v + b) mod V.
struct Permutation {
    int64_t a = 1, b = 0, V = 1;
    Permutation(uint64_t seed, int64_t vocab) : V(vocab) {
        const uint64_t h = mix64(seed ^ 0x756e656d626564ull);
        a = int64_t(h % uint64_t(V)) | 1;
        while (gcd64(a, V) != 1) a = (a + 2) % V;
        b = int64_t(mix64(h) % uint64_t(V));
    }
    int64_t operator()(int64_t v) const { return int64_t((__int128(a) * v + b) % V); }
    int64_t inverse(int64_t t) const {
        // a^-1 mod V by the extended Euclidean algorithm.
        int64_t r0 = V, r1 = a, s0 = 0, s1 = 1;
        while (r1 != 0) {
            const int64_t q = r0 / r1;
            std::tie(r0, r1) = std::make_tuple(r1, r0 - q * r1);
            std::tie(s0, s1) = std::make_tuple(s1, s0 - q * s1);
        }
        const int64_t inv = ((s0 % V) + V) % V;
        return int64_t((__int128(inv) * (((t - b) % V + V) % V)) % V);
    }
};

// Generates the values of every logical tensor.
class Generator {
public:
    Generator(const Config& c, uint64_t seed, const SyntheticInit& init)
        : c_(c), init_(init), perm_(seed, c.vocab_size) {
        for (uint32_t r = 0; r < kRoles; ++r)
            for (int l = 0; l < c.n_layers; ++l) keys_.push_back(stream_key(seed, Role(r), l));
        code_dims_ = init.route_code_dims;
        if (code_dims_ == 0) {
            code_dims_ = 1;
            while (code_dims_ * 2 <= std::min(32, c.d_model / 8)) code_dims_ *= 2;
        }
        OSPREY_CHECK(code_dims_ >= 1 && code_dims_ <= c.d_model && (code_dims_ & (code_dims_ - 1)) == 0,
                     "synthetic: route_code_dims must be a power of two <= d_model, got ", code_dims_);
        build_routing();
        mlp1_scale_base_ = scale_base(1.0f / std::sqrt(float(c.d_model)));
        mlp2_scale_base_ = scale_base(init.mlp_update * init.embed_scale / (kSwigluOutRms * std::sqrt(float(c.d_ff))));
    }

    // BF16 element `index` of logical tensor (role, layer), as a float before rounding.
    float value(Role role, int layer, uint64_t index) const {
        const uint64_t key = key_of(role, layer);
        const float H = float(c_.d_model);
        auto rms = [&](float r) { return uniform(key, index) * r * kSqrt3; };
        switch (role) {
            case Role::embedding: {
                const uint64_t row = index / uint64_t(c_.d_model), col = index % uint64_t(c_.d_model);
                return embed_negative(row, col) ? -init_.embed_scale : init_.embed_scale;
            }
            case Role::unembedding: {
                const uint64_t row = index / uint64_t(c_.d_model), col = index % uint64_t(c_.d_model);
                const bool neg = embed_negative(uint64_t(perm_(int64_t(row))), col);
                return (neg ? -init_.top_logit : init_.top_logit) / H;
            }
            case Role::final_norm:
            case Role::attn_norm:
            case Role::mlp_norm: return 1.0f + rms(init_.norm_gain_jitter);
            case Role::q_w:
            case Role::k_w:
            case Role::v_w: return rms(1.0f / std::sqrt(H));
            case Role::q_b:
            case Role::k_b:
            case Role::v_b: return rms(init_.qkv_bias);
            case Role::sinks: return uniform(key, index) * init_.sink_scale;
            case Role::out_w: return rms(init_.attn_update * init_.embed_scale / std::sqrt(float(c_.q_dim())));
            case Role::out_b: return rms(init_.out_bias * init_.attn_update * init_.embed_scale);
            case Role::router_w: {
                const int e = int(index / uint64_t(c_.d_model)), j = int(index % uint64_t(c_.d_model));
                if (j >= code_dims_) return rms(init_.router_noise / std::sqrt(H - float(code_dims_)));
                int sum = 0;
                for (int cls : classes_of_[size_t(layer) * size_t(c_.n_experts) + size_t(e)]) sum += hadamard(cls, j);
                return init_.router_class_logit / float(code_dims_) * float(sum);  // inputs are normalised to ±1
            }
            case Role::router_b: return uniform(key, index) * init_.router_bias_jitter;
            case Role::mlp1_bias: return rms(init_.mlp1_bias);
            case Role::mlp2_bias: return rms(init_.out_bias * init_.mlp_update * init_.embed_scale);
            default: break;
        }
        OSPREY_FAIL("synthetic: role ", uint32_t(role), " is not a BF16 tensor");
    }

    // U8 elements [index, index + n) of an MXFP4 tensor; one hash gives 8 bytes.
    void bytes(Role role, int layer, uint64_t index, uint8_t* out, size_t n) const {
        OSPREY_CHECK(role == Role::mlp1_blocks || role == Role::mlp2_blocks || role == Role::mlp1_scales ||
                         role == Role::mlp2_scales,
                     "synthetic: role ", uint32_t(role), " is not a U8 tensor");
        const uint64_t key = key_of(role, layer);
        const bool scales = role == Role::mlp1_scales || role == Role::mlp2_scales;
        const int base = role == Role::mlp1_scales ? mlp1_scale_base_ : mlp2_scale_base_;
        for (size_t i = 0; i < n;) {
            const uint64_t word = (index + i) / 8;
            uint64_t h = bits(key, word);
            for (unsigned b = unsigned((index + i) % 8); b < 8 && i < n; ++b, ++i) {
                const uint8_t v = uint8_t(h >> (8 * b));
                out[i] = scales ? uint8_t(base + int(v % 3) - 1) : v;  // scale: base exponent jittered by -1/0/+1
            }
        }
    }

    const Permutation& permutation() const { return perm_; }

    // Routing class of a token (uniform over the code_dims classes).
    int class_of(int64_t token) const {
        return int(bits(key_of(Role::embedding, 0) ^ 0x636c617373ull, uint64_t(token)) % uint64_t(code_dims_));
    }
    const std::vector<int>& expert_set(int layer, int cls) const {
        return sets_[size_t(layer) * size_t(code_dims_) + size_t(cls)];
    }

private:
    // E8M0 byte whose jittered uniform-FP4 blocks have RMS ~target.
    static int scale_base(float target) {
        const int e = int(std::lround(std::log2(target / (kFp4Rms * kScaleJitterRms))));
        const int s = e + 127;
        OSPREY_CHECK(s >= 1 && s <= 253, "synthetic: expert weight scale out of the E8M0 range");
        return s;
    }

    static int hadamard(int row, int col) { return (std::popcount(unsigned(row & col)) & 1) ? -1 : 1; }

    // Sign of embedding element (token, dim): the class's Hadamard row on the code dims, random elsewhere.
    bool embed_negative(uint64_t token, uint64_t dim) const {
        if (dim < uint64_t(code_dims_)) return hadamard(class_of(int64_t(token)), int(dim)) < 0;
        return bits(key_of(Role::embedding, 0), token * uint64_t(c_.d_model) + dim) >> 63;
    }

    // Per layer and class, the experts S_c: class c takes group (c mod G) of permutation round c / G,
    // G = n_experts / top_k disjoint groups per round.
    void build_routing() {
        const int E = c_.n_experts, k = c_.top_k, G = std::max(1, E / k);
        sets_.assign(size_t(c_.n_layers) * size_t(code_dims_), {});
        classes_of_.assign(size_t(c_.n_layers) * size_t(E), {});
        for (int l = 0; l < c_.n_layers; ++l) {
            std::vector<int> perm;
            for (int cls = 0; cls < code_dims_; ++cls) {
                const int round = cls / G, group = cls % G;
                if (group == 0) {  // a fresh permutation per round
                    const uint64_t key = mix64(key_of(Role::router_w, l) ^ mix64(uint64_t(round) + 0x726f75746eull));
                    perm.resize(size_t(E));
                    std::iota(perm.begin(), perm.end(), 0);
                    std::sort(perm.begin(), perm.end(), [&](int x, int y) {
                        const uint64_t hx = bits(key, uint64_t(x)), hy = bits(key, uint64_t(y));
                        return hx != hy ? hx < hy : x < y;
                    });
                }
                std::vector<int>& set = sets_[size_t(l) * size_t(code_dims_) + size_t(cls)];
                for (int i = 0; i < k; ++i) set.push_back(perm[size_t((group * k + i) % E)]);
                std::sort(set.begin(), set.end());
                for (int e : set) classes_of_[size_t(l) * size_t(E) + size_t(e)].push_back(cls);
            }
        }
    }

    uint64_t key_of(Role role, int layer) const { return keys_[size_t(uint32_t(role)) * size_t(c_.n_layers) + size_t(layer)]; }

    Config c_;
    std::vector<uint64_t> keys_;  // [kRoles, n_layers] stream keys
    int code_dims_ = 1;                         // routing classes = embedding dims carrying the class
    std::vector<std::vector<int>> sets_;        // [n_layers, code_dims] experts of each class
    std::vector<std::vector<int>> classes_of_;  // [n_layers, n_experts] classes choosing each expert
    SyntheticInit init_;
    Permutation perm_;
    int mlp1_scale_base_ = 127, mlp2_scale_base_ = 127;
};

// One tensor of the output files and where its values come from.
struct Planned {
    io::TensorSpec spec;
    Role role;
    int layer;
    const char* logical;  // original/dtypes.json type: BF16, FP4, UE8
};

std::vector<Planned> plan_tensors(const Config& c, Layout layout) {
    const int64_t H = c.d_model, Q = c.q_dim(), K = c.kv_dim(), E = c.n_experts, I = c.d_ff, V = c.vocab_size;
    std::vector<Planned> out;
    auto add = [&](std::string name, DType dt, std::vector<int64_t> shape, Role role, int layer, const char* logical) {
        out.push_back({io::TensorSpec{std::move(name), dt, std::move(shape)}, role, layer, logical});
    };
    const bool hf = layout == Layout::hf;
    add(hf ? "model.embed_tokens.weight" : "embedding.weight", DType::bf16, {V, H}, Role::embedding, 0, "BF16");
    for (int i = 0; i < c.n_layers; ++i) {
        if (hf) {
            const std::string p = str("model.layers.", i, ".");
            add(p + "input_layernorm.weight", DType::bf16, {H}, Role::attn_norm, i, "BF16");
            add(p + "self_attn.q_proj.weight", DType::bf16, {Q, H}, Role::q_w, i, "BF16");
            add(p + "self_attn.q_proj.bias", DType::bf16, {Q}, Role::q_b, i, "BF16");
            add(p + "self_attn.k_proj.weight", DType::bf16, {K, H}, Role::k_w, i, "BF16");
            add(p + "self_attn.k_proj.bias", DType::bf16, {K}, Role::k_b, i, "BF16");
            add(p + "self_attn.v_proj.weight", DType::bf16, {K, H}, Role::v_w, i, "BF16");
            add(p + "self_attn.v_proj.bias", DType::bf16, {K}, Role::v_b, i, "BF16");
            add(p + "self_attn.o_proj.weight", DType::bf16, {H, Q}, Role::out_w, i, "BF16");
            add(p + "self_attn.o_proj.bias", DType::bf16, {H}, Role::out_b, i, "BF16");
            add(p + "self_attn.sinks", DType::bf16, {c.n_heads}, Role::sinks, i, "BF16");
            add(p + "post_attention_layernorm.weight", DType::bf16, {H}, Role::mlp_norm, i, "BF16");
            add(p + "mlp.router.weight", DType::bf16, {E, H}, Role::router_w, i, "BF16");
            add(p + "mlp.router.bias", DType::bf16, {E}, Role::router_b, i, "BF16");
            add(p + "mlp.experts.gate_up_proj_blocks", DType::u8, {E, 2 * I, H / 32, 16}, Role::mlp1_blocks, i, "FP4");
            add(p + "mlp.experts.gate_up_proj_scales", DType::u8, {E, 2 * I, H / 32}, Role::mlp1_scales, i, "UE8");
            add(p + "mlp.experts.gate_up_proj_bias", DType::bf16, {E, 2 * I}, Role::mlp1_bias, i, "BF16");
            add(p + "mlp.experts.down_proj_blocks", DType::u8, {E, H, I / 32, 16}, Role::mlp2_blocks, i, "FP4");
            add(p + "mlp.experts.down_proj_scales", DType::u8, {E, H, I / 32}, Role::mlp2_scales, i, "UE8");
            add(p + "mlp.experts.down_proj_bias", DType::bf16, {E, H}, Role::mlp2_bias, i, "BF16");
        } else {
            const std::string p = str("block.", i, ".");
            add(p + "attn.norm.scale", DType::bf16, {H}, Role::attn_norm, i, "BF16");
            add(p + "attn.qkv.weight", DType::bf16, {Q + 2 * K, H}, Role::qkv_w, i, "BF16");
            add(p + "attn.qkv.bias", DType::bf16, {Q + 2 * K}, Role::qkv_b, i, "BF16");
            add(p + "attn.sinks", DType::bf16, {c.n_heads}, Role::sinks, i, "BF16");
            add(p + "attn.out.weight", DType::bf16, {H, Q}, Role::out_w, i, "BF16");
            add(p + "attn.out.bias", DType::bf16, {H}, Role::out_b, i, "BF16");
            add(p + "mlp.norm.scale", DType::bf16, {H}, Role::mlp_norm, i, "BF16");
            add(p + "mlp.gate.weight", DType::bf16, {E, H}, Role::router_w, i, "BF16");
            add(p + "mlp.gate.bias", DType::bf16, {E}, Role::router_b, i, "BF16");
            add(p + "mlp.mlp1_weight.blocks", DType::u8, {E, 2 * I, H / 32, 16}, Role::mlp1_blocks, i, "FP4");
            add(p + "mlp.mlp1_weight.scales", DType::u8, {E, 2 * I, H / 32}, Role::mlp1_scales, i, "UE8");
            add(p + "mlp.mlp1_bias", DType::bf16, {E, 2 * I}, Role::mlp1_bias, i, "BF16");
            add(p + "mlp.mlp2_weight.blocks", DType::u8, {E, H, I / 32, 16}, Role::mlp2_blocks, i, "FP4");
            add(p + "mlp.mlp2_weight.scales", DType::u8, {E, H, I / 32}, Role::mlp2_scales, i, "UE8");
            add(p + "mlp.mlp2_bias", DType::bf16, {E, H}, Role::mlp2_bias, i, "BF16");
        }
    }
    add(hf ? "model.norm.weight" : "norm.scale", DType::bf16, {H}, Role::final_norm, 0, "BF16");
    add(hf ? "lm_head.weight" : "unembedding.weight", DType::bf16, {V, H}, Role::unembedding, 0, "BF16");
    return out;
}

// Fills bytes [offset, offset + n) of a planned tensor.
void fill_bytes(const Generator& g, const Config& c, const Planned& p, uint64_t offset, uint8_t* out, size_t n) {
    if (p.spec.dtype == DType::u8) {
        g.bytes(p.role, p.layer, offset, out, n);
        return;
    }
    // BF16: element e covers bytes [2e, 2e + 2) (little-endian); ranges may start or end mid-element.
    const uint64_t H = uint64_t(c.d_model), Q = uint64_t(c.q_dim()), K = uint64_t(c.kv_dim());
    auto element = [&](uint64_t e) -> uint16_t {
        Role role = p.role;
        uint64_t idx = e;
        if (role == Role::qkv_w || role == Role::qkv_b) {  // fused rows -> the q/k/v streams
            const bool w = role == Role::qkv_w;
            const uint64_t width = w ? H : 1;  // a weight row has H elements, a bias row one
            const uint64_t row = e / width, col = e % width;
            if (row < Q) {
                role = w ? Role::q_w : Role::q_b;
                idx = row * width + col;
            } else if (row < Q + K) {
                role = w ? Role::k_w : Role::k_b;
                idx = (row - Q) * width + col;
            } else {
                role = w ? Role::v_w : Role::v_b;
                idx = (row - Q - K) * width + col;
            }
        }
        return float_to_bf16(g.value(role, p.layer, idx)).bits;
    };
    uint64_t b = offset;
    const uint64_t end = offset + n;
    while (b < end) {
        const uint16_t v = element(b / 2);
        const uint8_t bytes[2] = {uint8_t(v & 0xff), uint8_t(v >> 8)};
        const uint64_t e_end = std::min(end, (b / 2) * 2 + 2);
        for (; b < e_end; ++b) out[b - offset] = bytes[b % 2];
    }
}

}  // namespace

std::vector<std::string> preset_names() {
    std::vector<std::string> out;
    for (const Preset& p : kPresets) out.emplace_back(p.name);
    return out;
}

Config preset_config(std::string_view preset) {
    for (const Preset& p : kPresets) {
        if (preset != p.name) continue;
        Config c;  // defaults: the real vocab, window, RoPE/YaRN, norm eps, SwiGLU constants, ids
        c.n_layers = p.n_layers;
        c.d_model = p.d_model;
        c.n_heads = p.n_heads;
        c.n_kv_heads = p.n_kv_heads;
        c.head_dim = p.head_dim;
        c.n_experts = p.n_experts;
        c.top_k = p.top_k;
        c.d_ff = p.d_ff;
        c.validate();
        return c;
    }
    std::string names;
    for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
    OSPREY_FAIL("unknown preset '", preset, "' (available: ", names, ")");
}

std::vector<io::TensorSpec> checkpoint_tensor_specs(const Config& config, Layout layout) {
    config.validate();
    std::vector<io::TensorSpec> out;
    for (const Planned& p : plan_tensors(config, layout)) out.push_back(p.spec);
    return out;
}

int64_t synthetic_next_token(const Config& config, uint64_t seed, int64_t token) {
    OSPREY_CHECK(token >= 0 && token < config.vocab_size, "token ", token, " outside the vocabulary");
    return Permutation(seed, config.vocab_size).inverse(token);
}

std::vector<int> synthetic_expert_set(const Config& config, uint64_t seed, int layer, int64_t token,
                                      const SyntheticInit& init) {
    OSPREY_CHECK(layer >= 0 && layer < config.n_layers, "layer ", layer, " outside [0, ", config.n_layers, ")");
    OSPREY_CHECK(token >= 0 && token < config.vocab_size, "token ", token, " outside the vocabulary");
    const Generator g(config, seed, init);
    return g.expert_set(layer, g.class_of(token));
}

SyntheticResult write_synthetic_checkpoint(const SyntheticOptions& options) {
    return write_synthetic_checkpoint(preset_config(options.preset), options);
}

SyntheticResult write_synthetic_checkpoint(const Config& config, const SyntheticOptions& o) {
    config.validate();
    OSPREY_CHECK(!o.out.empty(), "make-model: no output folder given");
    OSPREY_CHECK(o.max_shard_bytes > 0, "make-model: shard size limit must be > 0");
    if (!o.tokenizer_file.empty())
        OSPREY_CHECK(fs::is_regular_file(o.tokenizer_file), o.tokenizer_file.string(), ": tokenizer file not found");
    const fs::path dir = o.layout == Layout::hf ? o.out : o.out / "original";
    fs::create_directories(dir);

    const Generator gen(config, o.seed, o.init);
    const std::vector<Planned> plan = plan_tensors(config, o.layout);
    SyntheticResult result;
    const io::WriteOptions wopt{.threads = o.threads};
    const auto t0 = std::chrono::steady_clock::now();

    // Groups of plan indices, one per output file.
    std::vector<std::vector<size_t>> shards;
    if (o.layout == Layout::hf) {
        std::vector<uint64_t> sizes;
        for (const Planned& p : plan) sizes.push_back(p.spec.nbytes());
        shards = io::group_into_shards(sizes, o.max_shard_bytes);
    } else {
        shards.emplace_back(plan.size());
        std::iota(shards.back().begin(), shards.back().end(), size_t(0));
    }

    json::Value weight_map{json::Object{}};
    std::vector<std::pair<std::string, std::string>> entries;
    uint64_t total_size = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file = o.layout == Layout::hf ? io::shard_file_name(s, shards.size() - 1) : "model.safetensors";
        std::vector<io::TensorSpec> specs;
        for (size_t i : shards[s]) {
            specs.push_back(plan[i].spec);
            entries.emplace_back(plan[i].spec.name, file);
            total_size += plan[i].spec.nbytes();
        }
        const std::vector<size_t>& members = shards[s];
        const auto metadata = o.layout == Layout::hf ? std::vector<std::pair<std::string, std::string>>{{"format", "pt"}}
                                                     : std::vector<std::pair<std::string, std::string>>{};
        log::info("make-model: writing ", (dir / file).string(), " (", specs.size(), " tensors)");
        result.bytes += io::write_safetensors(
            dir / file, specs, metadata,
            [&](size_t index, uint64_t offset, uint8_t* out, size_t n) {
                fill_bytes(gen, config, plan[members[index]], offset, out, n);
            },
            wopt);
        result.files.push_back(dir / file);
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    if (o.layout == Layout::hf) {
        // Shards of an earlier, differently sharded run in the same folder would confuse loaders that
        // glob *.safetensors: remove model-*-of-*.safetensors files that are not part of this checkpoint.
        for (const auto& f : fs::directory_iterator(dir)) {
            const std::string n = f.path().filename().string();
            const bool ours = std::find(result.files.begin(), result.files.end(), f.path()) != result.files.end();
            if (!ours && n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos &&
                f.path().extension() == ".safetensors")
                fs::remove(f.path());
        }
        std::sort(entries.begin(), entries.end());
        for (const auto& [name, file] : entries) weight_map.set(name, file);
        json::Value index{json::Object{}};
        json::Value meta{json::Object{}};
        meta.set("total_size", total_size);
        index.set("metadata", meta);
        index.set("weight_map", weight_map);
        write_file(dir / "model.safetensors.index.json", index.dump(2) + "\n");
        write_file(dir / "config.json", config.to_hf_json().dump(2) + "\n");
        write_file(dir / "generation_config.json", config.to_generation_config_json().dump(2) + "\n");
        for (const char* f : {"model.safetensors.index.json", "config.json", "generation_config.json"})
            result.files.push_back(dir / f);
    } else {
        json::Value dtypes{json::Object{}};
        for (const Planned& p : plan) dtypes.set(p.spec.name, p.logical);
        write_file(dir / "config.json", config.to_original_json().dump(2) + "\n");
        write_file(dir / "dtypes.json", dtypes.dump(2) + "\n");
        result.files.push_back(dir / "config.json");
        result.files.push_back(dir / "dtypes.json");
    }
    if (!o.tokenizer_file.empty()) {
        const fs::path dst = o.out / "o200k_base.tiktoken";
        fs::copy_file(o.tokenizer_file, dst, fs::copy_options::overwrite_existing);
        result.files.push_back(dst);
    }
    return result;
}

}  // namespace osprey::model
