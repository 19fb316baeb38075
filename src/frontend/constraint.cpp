// Output formats -> grammars -> Harmony-aware token constraints (see constraint.h).
#include "frontend/constraint.h"

#include <algorithm>
#include <list>
#include <mutex>
#include <string_view>

#include "frontend/api_error.h"
#include "grammar/json_schema.h"
#include "grammar/parse.h"
#include "harmony/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace osprey::frontend {

struct SharedMasker {
    SharedMasker(std::shared_ptr<const grammar::VocabTrie> trie, std::shared_ptr<const grammar::Grammar> g)
        : masker(std::move(trie), std::move(g)) {}
    std::mutex mu;
    grammar::TokenMasker masker;
};

namespace {

// osprey::Error messages start with the throwing source's "file:line: "; an API error does not.
std::string without_location(const std::string& what) {
    const size_t colon = what.find(": ");
    if (colon == std::string::npos) return what;
    const std::string_view head(what.data(), colon);
    const bool located = head.find(".cpp:") != std::string_view::npos || head.find(".h:") != std::string_view::npos;
    return located ? what.substr(colon + 2) : what;
}

grammar::Grammar compile_grammar(const OutputFormat& f) {
    using Kind = OutputFormat::Kind;
    switch (f.kind) {
        case Kind::json_object:
            return grammar::json_object_grammar();
        case Kind::json_schema:
            return grammar::json_schema_grammar(f.schema);
        case Kind::regex: {
            grammar::GrammarBuilder b;
            return b.build(b.add("root", grammar::parse_regex(f.text)));
        }
        case Kind::grammar:
            return grammar::parse_gbnf(f.text);
        case Kind::choice: {
            OSPREY_CHECK(!f.choices.empty(), "at least one choice is needed");
            std::vector<grammar::ExprPtr> alts;
            for (const std::string& c : f.choices) alts.push_back(grammar::literal(c));
            grammar::GrammarBuilder b;
            return b.build(b.add("root", grammar::alt(std::move(alts))));
        }
        case Kind::none:
            break;
    }
    OSPREY_FAIL("no format to compile");
}

std::string cache_key(const OutputFormat& f) {
    std::string key = std::to_string(int(f.kind)) + ":";
    switch (f.kind) {
        case OutputFormat::Kind::json_schema:
            key += f.schema.dump();
            break;
        case OutputFormat::Kind::choice: {
            json::Array a;
            for (const std::string& c : f.choices) a.emplace_back(c);
            key += json::Value(std::move(a)).dump();
            break;
        }
        default:
            key += f.text;
    }
    return key;
}

// Compiled formats, least recently used dropped first.
class FormatCache {
public:
    std::shared_ptr<SharedMasker> get(const std::string& key) {
        std::lock_guard lock(mu_);
        for (auto it = entries_.begin(); it != entries_.end(); ++it)
            if (it->first == key) {
                entries_.splice(entries_.begin(), entries_, it);
                return it->second;
            }
        return nullptr;
    }
    void put(const std::string& key, std::shared_ptr<SharedMasker> m) {
        std::lock_guard lock(mu_);
        entries_.emplace_front(key, std::move(m));
        if (entries_.size() > kMaxEntries) entries_.pop_back();
    }

private:
    static constexpr size_t kMaxEntries = 64;
    std::mutex mu_;
    std::list<std::pair<std::string, std::shared_ptr<SharedMasker>>> entries_;
};

FormatCache& format_cache() {
    static FormatCache cache;
    return cache;
}

struct Shared {
    const tok::Tokenizer* tokenizer = nullptr;
    int vocab_words = 0;
    std::shared_ptr<SharedMasker> final_format;                   // final channel / raw text
    std::map<std::string, std::shared_ptr<SharedMasker>> args;    // function -> its arguments
    std::shared_ptr<SharedMasker> names;                          // tool_choice "required": the names
    std::shared_ptr<SharedMasker> json_word;                      // "json" after <|constrain|>
    std::vector<int32_t> raw_end;                                 // completions: the end tokens
};

class Constraint final : public engine::TokenConstraint {
public:
    // Where the output is. Free phases apply no mask.
    enum class Phase {
        header,       // free: a message header's text, up to <|message|>
        free_body,    // free: a message body that nothing constrains
        between,      // free: after a message's <|end|>
        body,         // constrained by cur_, ended by ends_ once accepted
        forced_name,  // constrained to the declared function names (tool_choice "required")
        forced_json,  // constrained to "json" after <|constrain|>
        done,
    };

    Constraint(std::shared_ptr<const Shared> shared, Phase phase) : sh_(std::move(shared)), phase_(phase) {}

    void start_body(std::shared_ptr<SharedMasker> m, std::vector<int32_t> ends) {
        phase_ = Phase::body;
        enter(std::move(m));
        ends_ = std::move(ends);
    }
    void start_forced_name() {
        phase_ = Phase::forced_name;
        enter(sh_->names);
    }

    std::unique_ptr<engine::TokenConstraint> clone() const override { return std::make_unique<Constraint>(*this); }

    bool fill_mask(std::span<uint32_t> mask) override {
        if (!cur_) return false;
        bool accepts = false;
        {
            std::lock_guard lock(cur_->mu);
            const std::vector<uint32_t>& m = cur_->masker.mask(state_);
            const size_t n = std::min(m.size(), mask.size());
            for (size_t i = 0; i < n; ++i) mask[i] |= m[i];
            accepts = cur_->masker.automaton().accepts(state_);
        }
        if (accepts) {
            if (phase_ == Phase::body) {
                for (int32_t t : ends_) grammar::mask_set(mask, t);
            } else if (phase_ == Phase::forced_name) {
                grammar::mask_set(mask, harmony::kMessage);
                grammar::mask_set(mask, harmony::kConstrain);
            } else if (phase_ == Phase::forced_json) {
                grammar::mask_set(mask, harmony::kMessage);
            }
        }
        return true;
    }

    bool accept(int32_t token) override {
        const bool special = sh_->tokenizer->is_special(token);
        if (cur_) return special ? accept_constrained_special(token) : advance(token);
        if (phase_ == Phase::done) return true;
        if (!special) {
            if (phase_ == Phase::header) header_ += sh_->tokenizer->token_bytes(token);
            return true;
        }
        switch (token) {
            case harmony::kStart:
                phase_ = Phase::header;
                header_.clear();
                break;
            case harmony::kChannel:
                if (phase_ != Phase::header) header_.clear();
                phase_ = Phase::header;
                header_ += "<|channel|>";
                break;
            case harmony::kConstrain:
                if (phase_ == Phase::header) header_ += " <|constrain|>";
                break;
            case harmony::kMessage:
                if (phase_ == Phase::header) open_body();
                break;
            case harmony::kEnd:
                phase_ = Phase::between;
                break;
            case harmony::kReturn:
            case harmony::kCall:
                phase_ = Phase::done;
                break;
            default:
                break;
        }
        return true;
    }

private:
    void enter(std::shared_ptr<SharedMasker> m) {
        cur_ = std::move(m);
        std::lock_guard lock(cur_->mu);
        state_ = cur_->masker.automaton().start();
    }
    void leave() {
        cur_.reset();
        state_ = 0;
    }

    bool advance(int32_t token) {
        std::string_view bytes;
        try {
            bytes = sh_->tokenizer->token_bytes(token);
        } catch (const Error&) {
            return false;
        }
        std::lock_guard lock(cur_->mu);
        const int32_t next = cur_->masker.automaton().next(state_, bytes);
        if (next == grammar::Automaton::kDead) return false;
        state_ = next;
        if (phase_ == Phase::forced_name) name_.append(bytes);
        return true;
    }

    bool accepts() {
        std::lock_guard lock(cur_->mu);
        return cur_->masker.automaton().accepts(state_);
    }

    bool accept_constrained_special(int32_t token) {
        if (!accepts()) return false;
        if (phase_ == Phase::body) {
            if (std::find(ends_.begin(), ends_.end(), token) == ends_.end()) return false;
            leave();
            phase_ = token == harmony::kEnd ? Phase::between : Phase::done;
            return true;
        }
        if (phase_ == Phase::forced_name && token == harmony::kConstrain) {
            phase_ = Phase::forced_json;
            enter(sh_->json_word);
            return true;
        }
        if ((phase_ == Phase::forced_name || phase_ == Phase::forced_json) && token == harmony::kMessage) {
            std::string name = name_;
            while (!name.empty() && name.back() == ' ') name.pop_back();
            auto it = sh_->args.find(name);
            if (it == sh_->args.end()) return false;
            start_body(it->second, {harmony::kCall});
            return true;
        }
        return false;
    }

    // A header ended with <|message|>: does its body have a grammar?
    void open_body() {
        auto word_after = [&](std::string_view marker) {
            const size_t at = header_.find(marker);
            if (at == std::string::npos) return std::string();
            size_t b = at + marker.size(), e = b;
            while (e < header_.size() && header_[e] != ' ' && header_[e] != '<') ++e;
            return header_.substr(b, e - b);
        };
        const std::string channel = word_after("<|channel|>");
        const std::string recipient = word_after("to=");
        const std::string_view prefix = "functions.";
        if (recipient.compare(0, prefix.size(), prefix) == 0) {
            auto it = sh_->args.find(recipient.substr(prefix.size()));
            if (it != sh_->args.end()) return start_body(it->second, {harmony::kCall});
        } else if (recipient.empty() && channel == "final" && sh_->final_format) {
            return start_body(sh_->final_format, {harmony::kReturn});
        }
        phase_ = Phase::free_body;
    }

    std::shared_ptr<const Shared> sh_;
    Phase phase_;
    std::string header_;  // the current header's text, formatting tokens written out
    std::string name_;    // forced_name: the function name written so far
    std::shared_ptr<SharedMasker> cur_;
    int32_t state_ = 0;
    std::vector<int32_t> ends_;
};

std::shared_ptr<SharedMasker> compile_cached(const tok::Tokenizer& tokenizer, const std::string& key,
                                             const OutputFormat& f) {
    if (auto m = format_cache().get(key)) return m;
    std::shared_ptr<const grammar::Grammar> g;
    try {
        g = std::make_shared<const grammar::Grammar>(compile_grammar(f));
    } catch (const ApiError&) {
        throw;
    } catch (const Error& e) {
        throw ApiError(400, f.param + ": " + without_location(e.what()), f.param);
    }
    auto m = std::make_shared<SharedMasker>(vocab_trie(tokenizer), std::move(g));
    format_cache().put(key, m);
    return m;
}

}  // namespace

std::shared_ptr<const grammar::VocabTrie> vocab_trie(const tok::Tokenizer& tokenizer) {
    static std::mutex mu;
    static std::map<const tok::Tokenizer*, std::shared_ptr<const grammar::VocabTrie>> tries;
    std::lock_guard lock(mu);
    auto& trie = tries[&tokenizer];
    if (!trie) trie = grammar::vocab_trie_of(tokenizer);
    return trie;
}

std::shared_ptr<SharedMasker> compile_format(const tok::Tokenizer& tokenizer, const OutputFormat& format) {
    return compile_cached(tokenizer, cache_key(format), format);
}

std::shared_ptr<const engine::TokenConstraint> make_harmony_constraint(const tok::Tokenizer& tokenizer,
                                                                       const HarmonyConstraintSpec& spec) {
    auto sh = std::make_shared<Shared>();
    sh->tokenizer = &tokenizer;
    if (spec.final_format.on()) sh->final_format = compile_format(tokenizer, spec.final_format);
    for (size_t i = 0; i < spec.tools.size(); ++i) {
        const harmony::ToolDescription& t = spec.tools[i];
        const bool forced = spec.forced.on && (spec.forced.name.empty() || spec.forced.name == t.name);
        if (!t.strict && !forced) continue;
        OutputFormat args;
        args.param = spec.tools_param + "[" + std::to_string(i) + "].parameters";
        if (t.parameters) {
            args.kind = OutputFormat::Kind::json_schema;
            args.schema = *t.parameters;
        } else {
            args.kind = OutputFormat::Kind::json_object;
        }
        try {
            sh->args[t.name] = compile_format(tokenizer, args);
        } catch (const ApiError&) {
            if (t.strict) throw;
            // A forced call to a function whose schema we cannot compile: any JSON object.
            args.kind = OutputFormat::Kind::json_object;
            sh->args[t.name] = compile_format(tokenizer, args);
        }
    }
    const bool required = spec.forced.on && spec.forced.name.empty();
    if (required) {
        OutputFormat names;
        names.kind = OutputFormat::Kind::regex;
        names.param = "tool_choice";
        std::string alts;
        for (const auto& [name, m] : sh->args) {
            if (!alts.empty()) alts += "|";
            for (char c : name) {  // names are [A-Za-z0-9_.-]: escape the dot and the dash
                if (c == '.' || c == '-') alts += '\\';
                alts += c;
            }
        }
        names.text = "(" + alts + ") ?";
        sh->names = compile_format(tokenizer, names);
        OutputFormat json_word;
        json_word.kind = OutputFormat::Kind::regex;
        json_word.param = "tool_choice";
        json_word.text = "json";
        sh->json_word = compile_format(tokenizer, json_word);
    }
    if (!sh->final_format && sh->args.empty()) return nullptr;
    auto c = std::make_shared<Constraint>(sh, Constraint::Phase::header);
    if (required) {
        c->start_forced_name();
    } else if (spec.forced.on) {
        c->start_body(sh->args.at(spec.forced.name), {harmony::kCall});
    }
    return c;
}

std::shared_ptr<const engine::TokenConstraint> make_raw_constraint(const tok::Tokenizer& tokenizer,
                                                                   const OutputFormat& format,
                                                                   std::vector<int32_t> end_tokens) {
    if (!format.on()) return nullptr;
    OSPREY_CHECK(!end_tokens.empty(), "a raw constraint needs an end token");
    auto sh = std::make_shared<Shared>();
    sh->tokenizer = &tokenizer;
    sh->final_format = compile_format(tokenizer, format);
    auto c = std::make_shared<Constraint>(sh, Constraint::Phase::header);
    c->start_body(sh->final_format, std::move(end_tokens));
    return c;
}

}  // namespace osprey::frontend
