#include "trainer/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>
#include <variant>

#include "core/check.h"
#include "core/input.h"
#include "core/text.h"
#include "kernels/backend.h"
#include "parallel/cost_model.h"
#include "parallel/strategy.h"

namespace dhp {
namespace {

// A key whose value is one of a set of names (an enum): read, written and printed by its name.
struct Choice {
  std::function<std::string()> get;
  std::function<void(const std::string&)> set;
  // Names a boolean stands for (false, true) where a key that was a flag became a choice;
  // empty where a boolean is a type error.
  std::string if_false, if_true;
};

// Three numbers (per-channel constants such as model.vision.pixel_mean), or three integers
// (model.mrope_section).
using Triple = std::array<double, 3>;
using IntTriple = std::array<int, 3>;
// A list of integers of any length (model.vision.deepstack).
using IntList = std::vector<int>;
// A count that may be "auto" (held as 0, which also reads as auto: what earlier versions wrote).
struct AutoCount {
  int* ref;
};
using Ref = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, Choice, Triple*, IntTriple*, IntList*,
                         AutoCount>;

struct Key {
  std::string section;              // "model" or "model.vision"
  std::string name;
  Ref ref;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // non-empty: the only accepted strings
  bool was_flag = false;             // an integer key that was a flag: false and true read as 0 and 1
  std::string path() const { return section + "." + name; }
};

// The one table of every configuration key: type (from the member), range and choices.
class Schema {
 public:
  explicit Schema(Config& c) { describe(c); }
  const std::vector<Key>& keys() const { return keys_; }
  const Key* find(const std::string& path) const {
    for (const auto& k : keys_)
      if (k.path() == path) return &k;
    return nullptr;
  }
  // A section with keys, or one holding such sections ([optim.groups] holds [optim.groups.vision]).
  bool is_section(const std::string& s) const {
    for (const auto& k : keys_)
      if (k.section == s || k.section.rfind(s + ".", 0) == 0) return true;
    return false;
  }

 private:
  std::vector<Key> keys_;
  std::string sec_;

  template <class T>
  void num(const char* name, T& ref, double lo, double hi) {
    keys_.push_back(Key{sec_, name, Ref(&ref), lo, hi, {}});
  }
  // A level that was an on/off flag (parallel.zero after parallel.zero1).
  void level(const char* name, int& ref, double hi) {
    keys_.push_back(Key{sec_, name, Ref(&ref), 0, hi, {}, true});
  }
  void count_or_auto(const char* name, int& ref, double hi) {
    keys_.push_back(Key{sec_, name, Ref(AutoCount{&ref}), 0, hi, {}});
  }
  template <class T>
  void triple(const char* name, std::array<T, 3>& ref, double lo, double hi) {
    keys_.push_back(Key{sec_, name, Ref(&ref), lo, hi, {}});
  }
  void list(const char* name, IntList& ref, double lo, double hi) {
    keys_.push_back(Key{sec_, name, Ref(&ref), lo, hi, {}});
  }
  void flag(const char* name, bool& ref) {
    keys_.push_back(Key{sec_, name, Ref(&ref), -INFINITY, INFINITY, {}});
  }
  void str(const char* name, std::string& ref, std::vector<std::string> choices = {}) {
    keys_.push_back(Key{sec_, name, Ref(&ref), -INFINITY, INFINITY, std::move(choices)});
  }
  // names: (value, name) pairs; the value is parsed once here and kept as the enum.
  template <class E, class Names>
  void choice(const char* name, E& ref, const Names& names, std::string if_false = {},
              std::string if_true = {}) {
    std::vector<std::pair<E, std::string>> table;
    for (const auto& [value, text] : names) table.emplace_back(value, std::string(text));
    std::vector<std::string> choices;
    for (const auto& [value, text] : table) choices.push_back(text);
    Choice c{[&ref, table] {
               for (const auto& [value, text] : table)
                 if (value == ref) return text;
               DHP_ASSERT(false);
               return std::string();
             },
             [&ref, table](const std::string& s) {
               for (const auto& [value, text] : table)
                 if (text == s) ref = value;
             },
             std::move(if_false), std::move(if_true)};
    keys_.push_back(Key{sec_, name, Ref(std::move(c)), -INFINITY, INFINITY, std::move(choices)});
  }

  void describe(Config& c) {
    const double big = 1e12;
    sec_ = "model";
    auto& m = c.model;
    num("dim", m.dim, 1, 1 << 16);
    num("layers", m.layers, 0, 1024);
    num("heads", m.heads, 1, 1024);
    num("kv_heads", m.kv_heads, 1, 1024);
    num("head_dim", m.head_dim, 0, 4096);
    num("ffn", m.ffn, 1, 1 << 20);
    num("vocab_size", m.vocab_size, 8, 1 << 24);
    num("rope_theta", m.rope_theta, 1, 1e12);
    flag("tie_embeddings", m.tie_embeddings);
    flag("attention_bias", m.attention_bias);
    flag("attention_out_bias", m.attention_out_bias);
    num("rms_norm_eps", m.rms_norm_eps, 1e-12, 0.1);
    flag("qk_norm", m.qk_norm);
    choice("rope_scaling", m.rope_scaling, kRopeScalingNames);
    num("rope_factor", m.rope_factor, 1, 1e6);
    num("rope_low_freq_factor", m.rope_low_freq_factor, 1e-6, 1e6);
    num("rope_high_freq_factor", m.rope_high_freq_factor, 1e-6, 1e6);
    num("rope_original_max_pos", m.rope_original_max_pos, 1, int64_t(1) << 40);
    num("max_position_embeddings", m.max_positions, 0, int64_t(1) << 40);
    triple("mrope_section", m.mrope_section, 0, 1 << 12);
    flag("mrope_interleaved", m.mrope_interleaved);
    str("init", m.init);
    sec_ = "model.vision";
    auto& v = c.model.vision;
    num("patch", v.patch, 1, 256);
    num("dim", v.dim, 1, 1 << 16);
    num("layers", v.layers, 0, 1024);
    num("heads", v.heads, 1, 1024);
    num("ffn", v.ffn, 1, 1 << 20);
    num("merge", v.merge, 1, 2);
    num("min_pixels", v.min_pixels, 1, big);
    num("max_pixels", v.max_pixels, 1, big);
    choice("arch", v.arch, kVisionArchNames);
    num("image_size", v.image_size, 0, 1 << 16);
    num("norm_eps", v.norm_eps, 1e-12, 0.1);
    choice("act", v.act, kVisionActNames);
    num("feature_layer", v.feature_layer, -1025, 1024);
    list("deepstack", v.deepstack, 0, 1023);
    choice("projector_act", v.projector_act, kProjectorActNames);
    triple("pixel_mean", v.pixel_mean, 0, 1);
    triple("pixel_std", v.pixel_std, 1e-6, 1e3);
    choice("resize", v.resize, kImageFitNames);
    num("min_tiles", v.min_tiles, 1, 64);
    num("max_tiles", v.max_tiles, -1, 64);
    flag("thumbnail", v.thumbnail);
    str("init", v.init);
    flag("post_norm", v.post_norm);
    flag("pool_head", v.pool_head);
    flag("embedded_tower", v.embedded_tower);

    sec_ = "data";
    auto& d = c.data;
    str("train", d.train);
    str("val", d.val);
    str("image_root", d.image_root);
    str("tokenizer", d.tokenizer);
    num("max_tokens", d.max_tokens, 8, big);
    num("max_image_pixels", d.max_image_pixels, 1, big);
    num("workers", d.workers, 0, kMaxDataWorkers);
    str("on_error", d.on_error, {"skip", "fail"});
    num("max_skipped", d.max_skipped, 0, 1);
    flag("allow_absolute_paths", d.allow_absolute_paths);
    choice("template", d.chat_template, kChatTemplateNames);
    str("added_tokens", d.added_tokens);
    num("video_fps", d.video.fps, 0.001, 1000);
    num("min_frames", d.video.min_frames, 1, 100000);
    num("max_frames", d.video.max_frames, 1, 100000);
    num("video_max_pixels", d.video.max_pixels, 1, big);

    sec_ = "train";
    auto& t = c.train;
    num("steps", t.steps, 0, big);
    num("batch_size", t.batch_size, 1, big);
    num("seed", t.seed, 0, 9.2e18);
    num("threads", t.threads, 0, 4096);
    flag("adapt_threads", t.adapt_threads);
    str("device", t.device, {"auto", "cpu", "cuda"});
    choice("precision", t.precision, kPrecisionNames);
    choice("attention", t.attention, kAttentionImplNames);

    sec_ = "optim";
    auto& o = c.optim;
    num("lr", o.lr, 0, 10);
    num("min_lr", o.min_lr, 0, 10);
    num("warmup", o.warmup, 0, big);
    num("weight_decay", o.weight_decay, 0, 10);
    num("beta1", o.beta1, 0, 0.999999);
    num("beta2", o.beta2, 0, 0.999999);
    num("eps", o.eps, 0, 1);
    num("grad_clip", o.grad_clip, 0, 1e6);
    for (size_t g = 0; g < kParamGroups; ++g) {
      sec_ = "optim.groups." + std::string(kParamGroupNames[g]);
      flag("trainable", o.groups.group[g].trainable);
      num("lr_scale", o.groups.group[g].lr_scale, 0, 1e3);
    }

    sec_ = "parallel";
    auto& p = c.parallel;
    std::vector<std::pair<Strategy, std::string_view>> trainable;
    for (const StrategyTraits& s : strategy_table())
      if (s.trainable) trainable.emplace_back(s.id, s.name);
    choice("strategy", p.strategy, trainable);
    num("memory_gb", p.memory_gb, 0.001, 1e6);
    level("zero", p.zero, kMaxZero);
    count_or_auto("ranks_per_node", p.ranks_per_node, 1 << 16);
    num("static_cp", p.static_cp, 0, 1 << 20);
    num("planner_budget_ms", p.planner_budget_ms, 0, 1e6);
    str("cost_profile", p.cost_profile);
    // Was a flag: true and false still read, as full and off.
    choice("recompute", p.recompute, kRecomputeNames, "off", "full");
    flag("refit", p.refit);
    num("refit_window", p.refit_window, 1, 1 << 20);
    num("timeout_s", p.timeout_s, 0.1, 1e7);
    flag("overlap_grads", p.overlap_grads);
    num("bucket_mb", p.bucket_mb, 1e-4, 1e6);

    sec_ = "checkpoint";
    auto& k = c.checkpoint;
    str("dir", k.dir);
    num("every", k.every, 0, big);
    num("keep", k.keep, 2, 1 << 20);
    num("timeout_s", k.timeout_s, 0, 1e7);
    flag("async_save", k.async_save);

    sec_ = "eval";
    auto& e = c.eval;
    num("every", e.every, 0, big);
    num("max_samples", e.max_samples, 0, big);
    flag("blank_images", e.blank_images);
    flag("exact_match", e.exact_match);
    flag("at_start", e.at_start);

    sec_ = "log";
    auto& l = c.log;
    str("level", l.level, {"debug", "info", "warn", "error"});
    num("every", l.every, 1, big);
    str("metrics", l.metrics);
    str("tensorboard", l.tensorboard);
    flag("progress", l.progress);
    str("color", l.color, {"auto", "always", "never"});
  }
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const Schema& s, const std::string& path) {
  // Keys that existed once: say what replaced them rather than a near spelling.
  const std::string groups = "optim.groups.";
  if (path.rfind(groups, 0) == 0) {
    const std::string name = path.substr(groups.size(), path.find('.', groups.size()) - groups.size());
    if (std::find(kParamGroupNames.begin(), kParamGroupNames.end(), name) == kParamGroupNames.end())
      return fmt::format(" ('{}' is no parameter group; the groups are: {})", printable(name),
                         fmt::join(kParamGroupNames, ", "));
  }
  if (path == "train.micro_tokens")
    return " (it is gone: the planner sizes every rank's micro-batches with its memory model, "
           "whose capacity is parallel.memory_gb)";
  const Key* best = nullptr;
  size_t best_d = 4;
  for (const auto& k : s.keys()) {
    size_t d = edit_distance(k.path(), path);
    if (d < best_d) best_d = d, best = &k;
  }
  return best ? fmt::format(" (did you mean '{}'?)", best->path()) : "";
}

std::string where(const std::string& file, const toml::source_region& src) {
  if (src.begin.line > 0) return fmt::format("{}:{}", file, src.begin.line);
  return file;
}

const char* type_name(const Ref& r) {
  return std::visit(
      [](const auto& alt) {
        using A = std::decay_t<decltype(alt)>;
        if constexpr (std::is_same_v<A, int*> || std::is_same_v<A, int64_t*> || std::is_same_v<A, uint64_t*>)
          return "an integer";
        else if constexpr (std::is_same_v<A, double*>) return "a number";
        else if constexpr (std::is_same_v<A, bool*>) return "a boolean (true or false)";
        else if constexpr (std::is_same_v<A, Triple*>) return "an array of 3 numbers";
        else if constexpr (std::is_same_v<A, IntTriple*>) return "an array of 3 integers";
        else if constexpr (std::is_same_v<A, IntList*>) return "an array of integers";
        else if constexpr (std::is_same_v<A, AutoCount>) return "an integer or \"auto\"";
        else return "a string";
      },
      r);
}

// What a TOML value is, in words, for "must be X, got Y".
const char* node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// Stores `node` into the key's member after checking its type and range.
void assign(const Key& key, const toml::node& node, const std::string& at) {
  auto bad_type = [&] {
    return Error(fmt::format("{}: '{}' must be {}, got {}", at, key.path(), type_name(key.ref),
                             node_type_name(node)));
  };
  // A NUL would end the value early wherever it is used as a C string (a path), and end any
  // message that quotes it.
  if (const auto* text = node.as_string())
    DHP_CHECK(text->get().find('\0') == std::string::npos, "{}: '{}' holds a NUL character: \"{}\"", at,
              key.path(), printable(text->get()));
  auto in_range = [&](double x) {
    DHP_CHECK(x >= key.lo && x <= key.hi, "{}: '{}' = {} is out of range [{}, {}]", at, key.path(),
              x, key.lo, key.hi);
  };
  auto one_of = [&](const std::string& v) {
    if (!key.choices.empty() && std::find(key.choices.begin(), key.choices.end(), v) == key.choices.end())
      throw Error(fmt::format("{}: '{}' = \"{}\" is not one of: {}", at, key.path(), v,
                              fmt::join(key.choices, ", ")));
  };
  std::visit(
      [&](const auto& alt) {
        using A = std::decay_t<decltype(alt)>;
        if constexpr (std::is_same_v<A, Choice>) {
          if (auto b = node.value_exact<bool>(); b && !alt.if_true.empty()) {
            alt.set(*b ? alt.if_true : alt.if_false);
            return;
          }
          auto v = node.value_exact<std::string>();
          if (!v) throw bad_type();
          one_of(*v);
          alt.set(*v);
        } else if constexpr (std::is_same_v<A, bool*>) {
          auto v = node.value_exact<bool>();
          if (!v) throw bad_type();
          *alt = *v;
        } else if constexpr (std::is_same_v<A, std::string*>) {
          auto v = node.value_exact<std::string>();
          if (!v) throw bad_type();
          one_of(*v);
          *alt = *v;
        } else if constexpr (std::is_same_v<A, Triple*> || std::is_same_v<A, IntTriple*>) {
          constexpr bool integers = std::is_same_v<A, IntTriple*>;
          const toml::array* arr = node.as_array();
          if (!arr) throw bad_type();
          DHP_CHECK(arr->size() == 3, "{}: '{}' must hold 3 {} ({}), got {}", at, key.path(),
                    integers ? "integers" : "numbers", integers ? "temporal, height, width" : "R, G, B",
                    arr->size());
          std::decay_t<decltype(*alt)> v{};
          for (size_t i = 0; i < 3; ++i) {
            const toml::node& e = *arr->get(i);
            double x = 0.0;
            if (e.is_floating_point() && !integers) x = *e.value_exact<double>();
            else if (e.is_integer()) x = double(*e.value_exact<int64_t>());
            else throw bad_type();
            in_range(x);
            v[i] = static_cast<std::decay_t<decltype(v[i])>>(x);
          }
          *alt = v;
        } else if constexpr (std::is_same_v<A, IntList*>) {
          const toml::array* arr = node.as_array();
          if (!arr) throw bad_type();
          IntList v;
          for (const toml::node& e : *arr) {
            if (!e.is_integer()) throw bad_type();
            const double x = double(*e.value_exact<int64_t>());
            in_range(x);
            v.push_back(int(x));
          }
          *alt = v;
        } else if constexpr (std::is_same_v<A, AutoCount>) {
          if (auto word = node.value_exact<std::string>()) {
            DHP_CHECK(*word == "auto", "{}: '{}' = \"{}\" must be a number or \"auto\"", at, key.path(),
                      printable(*word));
            *alt.ref = 0;
            return;
          }
          auto v = node.value_exact<int64_t>();
          if (!v) throw bad_type();
          in_range(double(*v));
          *alt.ref = int(*v);
        } else if constexpr (std::is_same_v<A, double*>) {
          std::optional<double> v;
          if (node.is_floating_point()) v = node.value_exact<double>();
          else if (node.is_integer()) v = double(*node.value_exact<int64_t>());
          if (!v) throw bad_type();
          in_range(*v);
          *alt = *v;
        } else {
          auto v = node.value_exact<int64_t>();
          if (auto b = node.value_exact<bool>(); b && key.was_flag) v = *b ? 1 : 0;
          if (!v) throw bad_type();
          in_range(double(*v));
          *alt = std::remove_pointer_t<A>(*v);
        }
      },
      key.ref);
}

// Keys that were renamed: still read, with a warning that names the new key.
struct Renamed {
  const char* old_path;
  const char* new_path;
  const char* why;
};
constexpr Renamed kRenamed[] = {
    {"parallel.device", "parallel.cost_profile",
     "it names the planner's cost profile, not the device train.device runs on"},
    {"parallel.zero1", "parallel.zero", "the ZeRO stage: false and true read as 0 and 1"},
};

// The key at `path`, following a rename (warned about once per place it is used).
const Key* find_key(const Schema& s, const std::string& path, const std::string& at) {
  for (const Renamed& r : kRenamed)
    if (path == r.old_path) {
      spdlog::warn("{}: '{}' is deprecated, use '{}' ({})", at, r.old_path, r.new_path, r.why);
      return s.find(r.new_path);
    }
  return s.find(path);
}

void apply_table(const Schema& s, const toml::table& tbl, const std::string& prefix,
                 const std::string& file) {
  for (const auto& [k, node] : tbl) {
    std::string name(k.str());
    std::string path = prefix.empty() ? name : prefix + "." + name;
    std::string at = where(file, node.source());
    if (node.is_table()) {
      // `lr = {x = 1}` is a key given a table, not an unknown section.
      if (const Key* key = s.find(path)) assign(*key, node, at);
      DHP_CHECK(s.is_section(path), "{}: unknown section [{}]{}", at, path, suggestion(s, path));
      apply_table(s, *node.as_table(), path, file);
      continue;
    }
    const Key* key = find_key(s, path, at);
    if (!key) {
      if (prefix.empty())
        throw Error(fmt::format("{}: '{}' must be inside a section such as [train]", at, path));
      throw Error(fmt::format("{}: unknown key '{}'{}", at, path, suggestion(s, path)));
    }
    assign(*key, node, at);
  }
}

void apply_override(const Schema& s, std::string text) {
  if (text.rfind("--", 0) == 0) text = text.substr(2);
  auto eq = text.find('=');
  std::string at = fmt::format("command-line override '--{}'", printable(text));
  DHP_CHECK(eq != std::string::npos, "{}: expected --section.key=value", at);
  std::string path = text.substr(0, eq), value = text.substr(eq + 1);
  const Key* key = find_key(s, path, at);
  DHP_CHECK(key, "{}: unknown key '{}'{}", at, printable(path), suggestion(s, path));
  // A line break would let the rest of the text become other keys or sections of the TOML
  // document the value is parsed in, which would then be dropped without a word.
  DHP_CHECK(value.find_first_of("\n\r") == std::string::npos,
            "{}: the value must be a single TOML value (it holds a line break)", at);
  // The value is TOML (so 1e-3, true, "x" mean what they mean in the file); a bare word that
  // is not valid TOML is taken as a string, so --parallel.strategy=pow2 needs no quotes.
  std::optional<toml::table> parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
  }
  DHP_CHECK(!parsed || parsed->size() == 1, "{}: the value must be a single TOML value", at);
  // Digits that do not parse are an integer beyond 64 bits, not a string.
  const bool integral = std::holds_alternative<int*>(key->ref) || std::holds_alternative<int64_t*>(key->ref) ||
                        std::holds_alternative<uint64_t*>(key->ref) || std::holds_alternative<AutoCount>(key->ref);
  const bool digits = value.find_first_not_of("+-0123456789_") == std::string::npos &&
                      value.find_first_of("0123456789") != std::string::npos;
  DHP_CHECK(parsed || !integral || !digits, "{}: '{}' = {} is out of range [{}, {}]", at, key->path(), value,
            key->lo, key->hi);
  const bool takes_string = std::holds_alternative<std::string*>(key->ref) || std::holds_alternative<Choice>(key->ref);
  const Choice* c = std::get_if<Choice>(&key->ref);
  const bool boolean_choice = c && !c->if_true.empty() && parsed && (*parsed)["v"].is_boolean();
  if (parsed && (boolean_choice || !(takes_string && !(*parsed)["v"].is_string()))) {
    assign(*key, *parsed->get("v"), at);
  } else {
    toml::value<std::string> as_string(value);
    assign(*key, as_string, at);
  }
}

template <class Names, class E>
std::string value_name(const Names& names, E value) {
  for (const auto& [v, n] : names)
    if (v == value) return std::string(n);
  return "?";
}

// The tower's own relations, once its arch and shape are known.
void validate_tower(const VisionConfig& v, const std::string& f) {
  DHP_CHECK(v.dim % v.heads == 0, "{}: model.vision.dim ({}) must be divisible by model.vision.heads ({})",
            f, v.dim, v.heads);
  const TowerTraits& t = v.traits();
  if (t.rope != TowerRope::none)
    DHP_CHECK(v.head_dim() % 4 == 0,
              "{}: the vision head dimension ({}) must be a multiple of 4 for 2-D RoPE", f,
              v.head_dim());
  DHP_CHECK(v.deepstack.empty() || t.deepstack,
            "{}: model.vision.deepstack is set, but a {} tower has no DeepStack mergers", f, t.name);
  for (size_t i = 0; i < v.deepstack.size(); ++i)
    DHP_CHECK(v.deepstack[i] < v.layers && (i == 0 || v.deepstack[i] > v.deepstack[i - 1]),
              "{}: model.vision.deepstack = [{}] must name increasing layers of the {}-layer tower (0 to {})", f,
              fmt::join(v.deepstack, ", "), v.layers, v.layers - 1);
  if (t.learned_positions) {
    DHP_CHECK(v.image_size > 0,
              "{}: model.vision.arch = \"{}\" needs model.vision.image_size, the side its position "
              "embeddings were trained at (Hugging Face vision_config.image_size)", f, t.name);
    DHP_CHECK(v.image_size % v.patch == 0,
              "{}: model.vision.image_size ({}) must be a multiple of model.vision.patch ({}): the "
              "position grid is image_size / patch", f, v.image_size, v.patch);
  }
  const ImageGeometry g = data_geometry(v);
  if (g.tiled()) {
    DHP_CHECK(t.temporal_patch == 1, "{}: model.vision.max_tiles = {} tiles images for a {} tower, whose patches "
              "span {} frames; tiling is InternVL's (set max_tiles = 0)", f, g.max_tiles, t.name, t.temporal_patch);
    DHP_CHECK(g.min_tiles <= g.max_tiles, "{}: model.vision.min_tiles ({}) exceeds max_tiles ({})", f, g.min_tiles,
              g.max_tiles);
    DHP_CHECK(v.image_size > 0 && v.image_size % v.factor() == 0,
              "{}: model.vision.max_tiles = {} cuts images into tiles of model.vision.image_size, which must be a "
              "positive multiple of patch x merge ({}), got {}", f, g.max_tiles, v.factor(), v.image_size);
  }
  // What a checkpoint's tower holds beside its layers exists only where the row has it.
  DHP_CHECK(!v.pool_head || t.pool_head, "{}: model.vision.pool_head is set, but a {} tower has no pooling head", f,
            t.name);
  DHP_CHECK(!v.post_norm || t.feature_layer, "{}: model.vision.post_norm is set, but a {} tower holds no "
            "post_layernorm", f, t.name);
  if (t.feature_layer)
    DHP_CHECK(v.feature_layer >= -(v.layers + 1) && v.feature_layer <= v.layers,
              "{}: model.vision.feature_layer = {} names no hidden state of a {}-layer tower "
              "(0 = the embeddings, 1..{} a layer's output, -1..-{} counted from the end)",
              f, v.feature_layer, v.layers, v.layers, v.layers + 1);
  if (v.fixed_square())
    DHP_CHECK(v.image_size > 0 && v.image_size % v.factor() == 0,
              "{}: model.vision.resize = \"{}\" resizes every image to image_size x "
              "image_size, so model.vision.image_size ({}) must be a positive multiple of patch x "
              "merge ({})", f, image_fit_name(v.resize), v.image_size, v.factor());
}

}  // namespace

void validate(const Config& c, bool folders_read) {
  const auto& m = c.model;
  const std::string& f = c.source;
  // cuDNN's fused attention stores bf16 or fp16 and runs on a GPU only: say so before a run
  // starts rather than fall back to another kernel than the one asked for.
  if (c.train.attention == AttentionImpl::cudnn) {
    DHP_CHECK(c.train.device != "cpu",
              "{}: train.attention = \"cudnn\" needs train.device = \"cuda\" (or \"auto\" on a "
              "machine with a GPU); the CPU backend has its own attention only", f);
    DHP_CHECK(c.train.precision == Precision::bf16 || c.train.precision == Precision::automatic,
              "{}: train.attention = \"cudnn\" needs train.precision = \"bf16\": cuDNN's fused "
              "attention has no fp32 or tf32 storage (train.attention = \"auto\" picks per precision)",
              f);
  }
  DHP_CHECK(m.head_dim > 0 || m.dim % m.heads == 0,
            "{}: model.dim ({}) must be divisible by model.heads ({}) unless model.head_dim is set",
            f, m.dim, m.heads);
  DHP_CHECK(m.heads % m.kv_heads == 0, "{}: model.heads ({}) must be a multiple of model.kv_heads ({})",
            f, m.heads, m.kv_heads);
  DHP_CHECK(m.hd() % 2 == 0, "{}: the head dimension ({}) must be even for RoPE", f, m.hd());
  const auto& ms = m.mrope_section;
  DHP_CHECK(!m.mrope() || ms[0] + ms[1] + ms[2] == m.hd() / 2,
            "{}: model.mrope_section = [{}, {}, {}] must split the head's {} rotary pairs (head dimension "
            "{} / 2): its three counts sum to {}", f, ms[0], ms[1], ms[2], m.hd() / 2, m.hd(), ms[0] + ms[1] + ms[2]);
  if (m.mrope() && m.mrope_interleaved) {
    // Interleaved, height takes pairs 1, 4, 7, ... below 3·h and width 2, 5, 8, ... below 3·w:
    // each axis gets its count only when those runs fit in the pairs (Qwen2-VL's blocked
    // [16, 24, 24] read as interleaved would give 22, 21, 21).
    int got[3] = {0, 0, 0};
    for (int i = 0; i < m.hd() / 2; ++i)
      ++got[i % 3 == 1 && i < 3 * ms[1] ? 1 : i % 3 == 2 && i < 3 * ms[2] ? 2 : 0];
    DHP_CHECK(got[0] == ms[0] && got[1] == ms[1] && got[2] == ms[2],
              "{}: model.mrope_section = [{}, {}, {}] interleaved gives the axes {}, {} and {} pairs: an "
              "interleaved split needs 3 x max(height, width) within the {} pairs (or set "
              "model.mrope_interleaved = false for the blocked layout)", f, ms[0], ms[1], ms[2], got[0], got[1],
              got[2], m.hd() / 2);
  }
  DHP_CHECK(m.rope_scaling != RopeScaling::dynamic || (m.max_positions > 0 && c.data.max_tokens <= m.max_positions),
            "{}: model.rope_scaling = \"dynamic\" is plain RoPE only within model.max_position_embeddings ({}); "
            "data.max_tokens = {} reaches past it", f, m.max_positions, c.data.max_tokens);
  // The llama3 rule blends between the two wavelength bounds and divides by their distance.
  DHP_CHECK(m.rope_scaling != RopeScaling::llama3 ||
                m.rope_high_freq_factor > m.rope_low_freq_factor,
            "{}: model.rope_scaling = \"llama3\" needs model.rope_high_freq_factor ({}) above "
            "model.rope_low_freq_factor ({})", f, m.rope_high_freq_factor, m.rope_low_freq_factor);
  const auto& v = m.vision;
  // A Hugging Face folder (model.vision.init, or a LLaVA checkpoint in model.init) brings the
  // tower's arch and shape: the tower's checks wait until apply_hf_init has read it and runs
  // validate again, so a user names the folder without restating what it says.
  if ((v.init.empty() && m.init.empty()) || folders_read) validate_tower(v, f);
  DHP_CHECK(!data_geometry(v).tiled() || !m.mrope(),
            "{}: model.vision.max_tiles stacks an image's tiles, which M-RoPE (model.mrope_section) would read as "
            "one grid; set max_tiles = 0 for an M-RoPE decoder", f);
  DHP_CHECK(int(v.deepstack.size()) <= m.layers,
            "{}: model.vision.deepstack names {} tower layers, whose features go into decoder layers 1 to {}, but "
            "the decoder has {} layers", f, v.deepstack.size(), v.deepstack.size(), m.layers);
  DHP_CHECK(v.min_pixels <= v.max_pixels, "{}: model.vision.min_pixels ({}) exceeds max_pixels ({})",
            f, v.min_pixels, v.max_pixels);
  DHP_CHECK(int64_t(v.factor()) * v.factor() <= v.max_pixels,
            "{}: model.vision.max_pixels ({}) is below one merged patch ({}x{} pixels)", f,
            v.max_pixels, v.factor(), v.factor());
  DHP_CHECK(c.data.video.min_frames <= c.data.video.max_frames,
            "{}: data.min_frames ({}) exceeds data.max_frames ({})", f, c.data.video.min_frames,
            c.data.video.max_frames);
  DHP_CHECK(c.optim.eps > 0, "{}: optim.eps must be positive (it keeps AdamW's update from "
            "dividing by zero), got {}", f, c.optim.eps);
  DHP_CHECK(!c.checkpoint.dir.empty(), "{}: checkpoint.dir is empty: set the folder checkpoints "
            "are saved in", f);
  DHP_CHECK(c.optim.min_lr <= c.optim.lr, "{}: optim.min_lr ({}) exceeds optim.lr ({})", f,
            c.optim.min_lr, c.optim.lr);
  DHP_CHECK(c.optim.groups.any_trainable(),
            "{}: every parameter group is frozen (optim.groups.{{{}}}.trainable = false): nothing "
            "would train", f, fmt::join(kParamGroupNames, ","));
  for (size_t g = 0; g < kParamGroups; ++g) {
    const GroupSettings& s = c.optim.groups.group[g];
    DHP_CHECK(!s.trainable || s.lr_scale > 0,
              "{}: optim.groups.{}.lr_scale = 0 with trainable = true: set trainable = false to "
              "freeze the group (a frozen group holds no gradients or optimizer state)",
              f, kParamGroupNames[g]);
  }
}

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped, so that
// to_toml() (what checkpoints store) parses back to the same value.
std::string toml_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\u{:04X}", unsigned(c));
    else out += ch;
  }
  return out + "\"";
}

std::string value_text(const Ref& r, bool quote) {
  return std::visit(
      [&](const auto& alt) -> std::string {
        using A = std::decay_t<decltype(alt)>;
        if constexpr (std::is_same_v<A, Choice>)
          return quote ? toml_quoted(alt.get()) : alt.get();
        else if constexpr (std::is_same_v<A, std::string*>)
          return quote ? toml_quoted(*alt) : *alt;
        else if constexpr (std::is_same_v<A, bool*>)
          return *alt ? "true" : "false";
        else if constexpr (std::is_same_v<A, Triple*> || std::is_same_v<A, IntTriple*>)
          return fmt::format("[{}, {}, {}]", (*alt)[0], (*alt)[1], (*alt)[2]);
        else if constexpr (std::is_same_v<A, IntList*>)
          return fmt::format("[{}]", fmt::join(*alt, ", "));
        else if constexpr (std::is_same_v<A, AutoCount>)
          return *alt.ref == 0 ? (quote ? "\"auto\"" : "auto") : fmt::format("{}", *alt.ref);
        else if constexpr (std::is_same_v<A, double*>) {
          std::string s = fmt::format("{}", *alt);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
          return s;
        } else
          return fmt::format("{}", *alt);
      },
      r);
}

Config finish(Config cfg, const toml::table& tbl, const std::string& name,
              const std::vector<std::string>& overrides, bool check) {
  cfg.source = name;
  // The pixel constants default by arch: unset until the file and the overrides are read.
  auto& v = cfg.model.vision;
  const Triple unset{NAN, NAN, NAN};
  v.pixel_mean = v.pixel_std = unset;
  Schema s(cfg);
  apply_table(s, tbl, "", name);
  for (const auto& o : overrides) apply_override(s, o);
  // The demo's files are the defaults of the demo alone: another data set never falls back to
  // them (a forgotten data.tokenizer would train on the demo's 160 pieces, a forgotten data.val
  // evaluate on the demo's captions). Only what the file or the command line named is used.
  const auto named = [&](const char* key) {
    return tbl["data"][key].node() != nullptr || overrides_set(overrides, fmt::format("data.{}", key));
  };
  if (cfg.data.train != DataConfig{}.train) {
    if (!named("val")) cfg.data.val.clear();
    if (!named("tokenizer")) cfg.data.tokenizer.clear();
  }
  v.resize_stated = tbl["model"]["vision"]["resize"].node() != nullptr || overrides_set(overrides, "model.vision.resize");
  const auto [mean, std] = default_pixel_norm(v.arch);
  if (std::isnan(v.pixel_mean[0])) v.pixel_mean = mean;
  if (std::isnan(v.pixel_std[0])) v.pixel_std = std;
  if (!check) return cfg;
  try {
    validate(cfg);
  } catch (const Error& e) {
    // What the command line set is its fault, not the file's: a checkpoint's /config is not
    // wrong because --train.attention=cudnn was asked of it on a CPU.
    if (overrides.empty()) throw;
    try {
      finish(Config{}, tbl, name, {}, true);
    } catch (const Error&) {
      throw e;
    }
    const std::string msg = e.what(), by = fmt::format("{} with {}", name, fmt::join(overrides, " "));
    throw Error(msg.rfind(name + ":", 0) == 0 ? by + msg.substr(name.size())
                                              : fmt::format("{} (set by the command line: {})", msg, by));
  }
  return cfg;
}

}  // namespace

Config parse_config(const std::string& text, const std::string& name,
                    const std::vector<std::string>& overrides, bool check) {
  toml::table parsed;
  try {
    parsed = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}:{}: invalid TOML: {}", name, e.source().begin.line, e.description()));
  }
  return finish(Config{}, parsed, name, overrides, check);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A regular file, as every input (core/input.h): a folder would read as empty, silently
  // meaning "all defaults"; a FIFO or a device would block or never end.
  constexpr int64_t kMaxConfigBytes = 16 << 20;  // far above any configuration
  const std::string text = InputFile("config file", path).read_all(kMaxConfigBytes, "16 MiB for a configuration");
  // An empty file means every default, which is rarely what was meant (and writes where the
  // demo writes): say so, once.
  bool empty = false;
  try {
    empty = toml::parse(text, path).empty();
  } catch (const toml::parse_error&) {  // reported by parse_config, with its line
  }
  if (empty)
    spdlog::warn("config file '{}' holds no keys: every setting is the built-in default (checkpoints in "
                 "'{}', metrics in '{}')", printable(path), CheckpointConfig{}.dir, LogConfig{}.metrics);
  return parse_config(text, path, overrides);
}

int compute_threads(const Config& cfg) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  // Ranks that mpirun or srun started on this node share its cores.
  int local_ranks = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var)) {
      local_ranks = std::max(1, std::atoi(v));
      break;
    }
  return std::max(1, default_compute_threads() / local_ranks);
}

BackendOptions backend_options(const Config& cfg) {
  BackendOptions o;
  o.threads = compute_threads(cfg);
  o.adapt_threads = cfg.train.adapt_threads;
  o.precision = cfg.train.precision;
  o.attention = cfg.train.attention;
  // One GPU per rank: the ranks a launcher started on this node take devices by local rank.
  o.device = std::max(0, launcher_local_rank());
  return o;
}

bool overrides_set(const std::vector<std::string>& overrides, const std::string& key) {
  return std::any_of(overrides.begin(), overrides.end(),
                     [&](const std::string& o) { return o.find(key + "=") != std::string::npos; });
}

void resolve_device_defaults(Config& cfg, bool say) {
  TrainConfig& t = cfg.train;
  t.device = backend_registry().resolve(t.device);
  const bool cuda = t.device == "cuda";
  if (t.precision == Precision::automatic) {
    t.precision = resolve_precision(t.precision, cuda ? Device::CUDA : Device::CPU);
    if (say)
      spdlog::info("train.precision auto: {}", cuda ? "bf16 (a CUDA device: bf16 weights and activations on "
                   "the tensor cores, fp32 master weights, gradients and Adam moments)"
                   : "fp32 (the CPU backend computes in fp32)");
  }
  std::string& profile = cfg.parallel.cost_profile;
  if (profile == "auto") {
    std::string why = "the CPU backend: the profile measured on the CPU";
    profile = cuda ? profile_for_device(backend_registry().device_name("cuda", std::max(0, launcher_local_rank())), &why)
                   : "cpu";
    if (say) spdlog::info("parallel.cost_profile auto: {} ({})", profile, why);
  }
}

std::string format_config(const Config& cfg) {
  Config copy = cfg;
  Schema s(copy);
  size_t width = 0;
  for (const auto& k : s.keys()) width = std::max(width, k.path().size());
  std::string out;
  for (const auto& k : s.keys())
    out += fmt::format("  {:<{}} = {}\n", k.path(), width, value_text(k.ref, true));
  return out;
}

std::vector<std::pair<std::string, std::string>> config_entries(const Config& cfg) {
  Config copy = cfg;
  Schema s(copy);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : s.keys()) out.emplace_back(k.path(), value_text(k.ref, true));
  return out;
}

std::string to_toml(const Config& cfg) {
  Config copy = cfg;
  Schema s(copy);
  std::string out, section;
  for (const auto& k : s.keys()) {
    if (k.section != section) {
      section = k.section;
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    out += fmt::format("{} = {}\n", k.name, value_text(k.ref, true));
  }
  return out;
}

}  // namespace dhp
