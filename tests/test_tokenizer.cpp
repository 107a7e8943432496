// The special-id table of both tokenizer kinds, added tokens, the chat templates' exact ids,
// layouts with and without image markers, shards recording their template, and checkpoints
// recording the table.
#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "core/hash.h"
#include "data/build.h"
#include "data/chat_template.h"
#include "data/codecs.h"
#include "data/config.h"
#include "data/dataset.h"
#include "data/layout.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"
#include "tests/data_fixture.h"
#include "tests/error_of.h"
#include "tests/tokenizer_fixture.h"
#include "trainer/checkpoint_file.h"

namespace dhp {
namespace {

using testing::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("dhp_test_tokenizer_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_ / "llama");
    train_llama_style_tokenizer((*root_ / "llama" / "tokenizer.model").string());
    train_dhp_fixture_tokenizer((*root_ / "dhp.model").string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static std::string llama() { return (*root_ / "llama" / "tokenizer.model").string(); }
  static std::string dhp_model() { return (*root_ / "dhp.model").string(); }
  // A folder holding a copy of the Llama-style model and `added_tokens` as added_tokens.json
  // ("" = none).
  static fs::path llama_folder(const std::string& name, const std::string& added_tokens) {
    const fs::path d = *root_ / name;
    fs::create_directories(d);
    fs::copy_file(llama(), d / "tokenizer.model", fs::copy_options::overwrite_existing);
    if (!added_tokens.empty()) write_text(d / kAddedTokensFile, added_tokens);
    return d;
  }
  static int sp_size(const std::string& path) {
    sentencepiece::SentencePieceProcessor sp;
    EXPECT_TRUE(sp.Load(path).ok());
    return sp.GetPieceSize();
  }
  static inline fs::path* root_ = nullptr;
};

// ---- the table -----------------------------------------------------------------------------

TEST_F(TokenizerTest, DhpOwnModelKeepsTodaysIdsAndHash) {
  const Tokenizer tok(dhp_model());
  EXPECT_EQ(format_special_ids(tok.ids()), "pad=0 unk=1 bos=2 eos=3 image=-1 img=4 /img=5");
  EXPECT_EQ(tok.ids(), SpecialIds{});
  EXPECT_TRUE(tok.ids().markers());
  EXPECT_TRUE(tok.added_tokens().empty());
  EXPECT_EQ(tok.vocab_size(), sp_size(dhp_model()));
  // The hash of a model without added tokens is the file's, as checkpoints and shards made
  // before added tokens existed recorded it.
  EXPECT_EQ(tok.hash(), hash_file(dhp_model()));
  EXPECT_EQ(parse_special_ids(format_special_ids(tok.ids()), "test"), tok.ids());
  EXPECT_THROW(parse_special_ids("pad=0 unk=1", "test"), Error);
  EXPECT_THROW(parse_special_ids("pad=x unk=1 bos=2 eos=3 image=-1 img=4 /img=5", "test"), Error);
}

TEST_F(TokenizerTest, LlamaStyleModelTakesItsOwnIdsAndAppendsLlavaTokens) {
  const int n = sp_size(llama());
  const Tokenizer tok(llama());
  EXPECT_EQ(tok.ids().unk, 0);
  EXPECT_EQ(tok.ids().bos, 1);
  EXPECT_EQ(tok.ids().eos, 2);
  EXPECT_EQ(tok.ids().image, n);
  EXPECT_EQ(tok.ids().pad, n + 1);  // the model has none: the added <pad>
  EXPECT_FALSE(tok.ids().markers());
  const std::vector<AddedToken> want = {{"<image>", n}, {"<pad>", n + 1}};
  EXPECT_EQ(tok.added_tokens(), want);
  EXPECT_EQ(tok.vocab_size(), n + 2);
  EXPECT_EQ(tok.padded_vocab_size(64) % 64, 0);
  EXPECT_GE(tok.padded_vocab_size(64), n + 2);
  EXPECT_LT(tok.padded_vocab_size(64), n + 2 + 64);
  EXPECT_NE(tok.hash(), hash_file(llama()));  // the added tokens are part of it

  const TokenizerFiles f = tok.files();
  EXPECT_EQ(f.model_path, llama());
  EXPECT_EQ(f.ids, tok.ids());
  EXPECT_EQ(f.added, want);
  EXPECT_EQ(f.sentencepiece_size, n);
  EXPECT_FALSE(f.model_has_pad);
}

TEST_F(TokenizerTest, AddedTokensAreWholeStringsInTextAndDecodeBack) {
  const int n = sp_size(llama());
  const Tokenizer tok(llama());
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(llama()).ok());
  const std::string text = "<image>\nWhat is in the image?<pad>";
  const std::vector<int32_t> ids = tok.encode(text);
  std::vector<int> middle;
  ASSERT_TRUE(sp.Encode("\nWhat is in the image?", &middle).ok());
  std::vector<int32_t> want = {n};
  want.insert(want.end(), middle.begin(), middle.end());
  want.push_back(n + 1);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok.decode(ids), text);
  // Without the added tokens the same text is many pieces.
  const Tokenizer bare(llama(), "none");
  const std::vector<int32_t> split = bare.encode("<image>");
  EXPECT_GT(split.size(), 1u);
  for (int32_t id : split) EXPECT_LT(id, n);
  // Byte fallback: characters the corpus never had still round-trip.
  const std::string rare = "caf\xc3\xa9 \xe2\x9c\x93";
  EXPECT_EQ(tok.decode(tok.encode(rare)), rare);
  // Ids past the vocabulary decode as <unk> (a model may have more output rows).
  EXPECT_EQ(tok.decode({tok.padded_vocab_size() - 1}), tok.decode({tok.ids().unk}));
  // The longest added token wins where two start at the same place.
  const Tokenizer more(llama(), "<im,<image>");
  EXPECT_EQ(more.encode("<image>"), std::vector<int32_t>{n + 1});
  EXPECT_EQ(more.encode("<im"), std::vector<int32_t>{n});
}

TEST_F(TokenizerTest, AddedTokensFileBesideTheModel) {
  const int n = sp_size(llama());
  // A folder works as data.tokenizer (a Hugging Face checkpoint folder).
  const fs::path d = llama_folder("hf", fmt::format("{{\"<image>\": {}, \"<pad>\": {}, \"<video>\": {}}}", n,
                                                    n + 1, n + 2));
  const Tokenizer tok(d.string());
  EXPECT_EQ(tok.path(), (d / "tokenizer.model").string());
  const std::vector<AddedToken> want = {{"<image>", n}, {"<pad>", n + 1}, {"<video>", n + 2}};
  EXPECT_EQ(tok.added_tokens(), want);
  EXPECT_EQ(tok.encode("<video>"), std::vector<int32_t>{n + 2});
  EXPECT_EQ(Tokenizer((d / "tokenizer.model").string()).added_tokens(), want);
  // data.added_tokens overrides the file.
  EXPECT_TRUE(Tokenizer(d.string(), "none").added_tokens().empty());
  EXPECT_NE(Tokenizer(d.string(), "none").hash(), tok.hash());
}

TEST_F(TokenizerTest, AWrongAddedTokenIdIsRefusedByNameIdAndFile) {
  const int n = sp_size(llama());
  // Negative control: the same file with consecutive ids loads.
  const fs::path good = llama_folder("good", fmt::format("{{\"<image>\": {}, \"<pad>\": {}}}", n, n + 1));
  EXPECT_NO_THROW(Tokenizer(good.string()));

  const fs::path gap = llama_folder("gap", fmt::format("{{\"<image>\": {}, \"<pad>\": {}}}", n, n + 5));
  std::string msg = error_of([&] { Tokenizer t(gap.string()); });
  EXPECT_TRUE(contains(msg, "'<pad>'")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(n + 5))) << msg;
  EXPECT_TRUE(contains(msg, (gap / kAddedTokensFile).string())) << msg;
  EXPECT_TRUE(contains(msg, fmt::format("expected {}", n + 1))) << msg;

  // An id inside the SentencePiece vocabulary.
  const fs::path inside = llama_folder("inside", "{\"<image>\": 5}");
  msg = error_of([&] { Tokenizer t(inside.string()); });
  EXPECT_TRUE(contains(msg, "'<image>' has id 5")) << msg;

  // A token that is already a piece of the model, under another id; restated under its own
  // id it adds nothing.
  const fs::path piece = llama_folder("piece", fmt::format("{{\"</s>\": {}}}", n));
  msg = error_of([&] { Tokenizer t(piece.string()); });
  EXPECT_TRUE(contains(msg, "already piece 2")) << msg;
  const fs::path restated = llama_folder("restated", fmt::format("{{\"</s>\": 2, \"<image>\": {}}}", n));
  EXPECT_EQ(Tokenizer(restated.string()).added_tokens(), (std::vector<AddedToken>{{"<image>", n}}));

  for (const std::string bad : {"[1, 2]", "{\"<image>\": \"32000\"}", "not json"}) {
    const fs::path d = llama_folder("bad", bad);
    msg = error_of([&] { Tokenizer t(d.string()); });
    EXPECT_TRUE(contains(msg, (d / kAddedTokensFile).string())) << bad << ": " << msg;
  }
}

TEST_F(TokenizerTest, MissingFilesAndConfiguredLists) {
  // A folder without tokenizer.model names the file it looked for.
  const fs::path empty = *root_ / "empty";
  fs::create_directories(empty);
  std::string msg = error_of([&] { Tokenizer t(empty.string()); });
  EXPECT_TRUE(contains(msg, empty.string() + "' is a folder without tokenizer.model")) << msg;
  // No added_tokens.json: the tokens the layout needs (covered above); "none": unk pads.
  const Tokenizer none(llama(), "none");
  EXPECT_TRUE(none.added_tokens().empty());
  EXPECT_EQ(none.ids().pad, none.ids().unk);
  EXPECT_EQ(none.ids().image, -1);
  const int n = sp_size(llama());
  const Tokenizer listed(llama(), " <image> , <pad>,<video>");
  const std::vector<AddedToken> want = {{"<image>", n}, {"<pad>", n + 1}, {"<video>", n + 2}};
  EXPECT_EQ(listed.added_tokens(), want);
  EXPECT_TRUE(contains(error_of([&] { Tokenizer t(llama(), "<image>,,<pad>"); }), "empty entry"));
  EXPECT_TRUE(contains(error_of([&] { Tokenizer t(llama(), "<s>"); }), "already piece 1"));
  EXPECT_TRUE(contains(error_of([&] { Tokenizer t(llama(), "<a>,<a>"); }), "listed twice"));
  // dhp's own model needs nothing added; markers given as added tokens are used as markers.
  EXPECT_TRUE(Tokenizer(dhp_model()).added_tokens().empty());
  const Tokenizer marked(llama(), "<img>,</img>");
  EXPECT_TRUE(marked.ids().markers());
  EXPECT_EQ(marked.ids().img_begin, n);
  EXPECT_EQ(marked.ids().img_end, n + 1);
}

// ---- chat templates -------------------------------------------------------------------------

struct Laid {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;
};

Laid lay(ChatTemplate t, const std::vector<Turn>& turns, const Tokenizer& tok) {
  Laid out;
  layout_conversation(t, turns, tok, out.ids, out.loss);
  return out;
}

std::vector<uint8_t> mask(int zeros, int ones) {
  std::vector<uint8_t> m(size_t(zeros), 0);
  m.insert(m.end(), size_t(ones), 1);
  return m;
}

const std::vector<Turn> kOneTurn = {{"human", "<image>\nWhat is in the image?"}, {"gpt", "A red circle."}};
const std::vector<Turn> kTwoTurns = {{"human", "<image>\nWhat is in the image?"},
                                     {"gpt", "A red circle."},
                                     {"human", "What color is it?"},
                                     {"gpt", "It is red."}};

// The ids docs/data.md quotes, exactly: the docs cannot drift from the code.
TEST_F(TokenizerTest, TemplatesGiveTheDocumentedIds) {
  const Tokenizer dh(dhp_model());
  const Tokenizer ll(llama());
  const int32_t pad = ll.ids().pad;
  // The fixtures' sizes docs/data.md quotes: 631 pieces + <image> 631 + <pad> 632; 200.
  EXPECT_EQ(ll.vocab_size(), 633);
  EXPECT_EQ(ll.ids().image, 631);
  EXPECT_EQ(pad, 632);
  EXPECT_EQ(dh.vocab_size(), 200);

  const Laid d = lay(ChatTemplate::Dhp, kOneTurn, dh);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{-1, 67, 20, 115, 10, 43, 195, 11, 40, 72, 180}));
  EXPECT_EQ(d.loss, mask(7, 4));

  const std::vector<int32_t> system = {264, 391, 402, 259, 403, 324, 292, 270, 409, 410, 327, 611,
                                       382, 327, 396, 404, 625, 407, 625, 292, 400, 401, 289, 263,
                                       324, 628, 599, 408, 611};
  std::vector<int32_t> v1 = system;
  const std::vector<int32_t> round1 = {294, 612, 594, -1, 594, 13, 542, 273, 368, 263, 296, 626,
                                       297, 612, 264, 293, 325, 611};
  v1.insert(v1.end(), round1.begin(), round1.end());
  const Laid one = lay(ChatTemplate::LlavaV1, kOneTurn, ll);
  EXPECT_EQ(one.ids, v1);
  EXPECT_EQ(one.loss, mask(43, 4));
  const Laid two = lay(ChatTemplate::LlavaV1, kTwoTurns, ll);
  std::vector<int32_t> v2 = v1;
  const std::vector<int32_t> round2 = {2, 294, 612, 320, 395, 273, 369, 626, 297, 612, 364, 273, 293, 611};
  v2.insert(v2.end(), round2.begin(), round2.end());
  EXPECT_EQ(two.ids, v2);
  std::vector<uint8_t> m2 = mask(43, 5);  // the first answer and its </s>
  const std::vector<uint8_t> r2 = mask(9, 4);
  m2.insert(m2.end(), r2.begin(), r2.end());
  EXPECT_EQ(two.loss, m2);

  const Laid p = lay(ChatTemplate::Plain, kOneTurn, ll);
  // LLaVA's plain target: the caption and its "\n" (<0x0A>, 13).
  EXPECT_EQ(p.ids, (std::vector<int32_t>{-1, 264, 293, 325, 611, 13}));
  EXPECT_EQ(p.loss, mask(1, 5));

  // Expanded with a 4-token image: markers from dhp's table, none from the Llama one.
  StoredLayout sd{d.ids.data(), d.loss.data(), int64_t(d.ids.size()), {{2, 2}}, dh.ids()};
  const Sample ed = expand_layout(sd, 0, full_length(sd), nullptr, 2, ImageLoad::Skip);
  EXPECT_EQ(ed.tokens, (std::vector<int32_t>{2, 4, 0, 0, 0, 0, 5, 67, 20, 115, 10, 43, 195, 11, 40, 72, 180, 3}));
  EXPECT_EQ(ed.loss_mask, mask(13, 5));
  StoredLayout sp{p.ids.data(), p.loss.data(), int64_t(p.ids.size()), {{2, 2}}, ll.ids()};
  const Sample ep = expand_layout(sp, 0, full_length(sp), nullptr, 2, ImageLoad::Skip);
  EXPECT_EQ(ep.tokens, (std::vector<int32_t>{1, pad, pad, pad, pad, 264, 293, 325, 611, 13, 2}));
  EXPECT_EQ(ep.loss_mask, mask(5, 6));
  EXPECT_EQ(ep.image_of, (std::vector<int32_t>{-1, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1}));
  StoredLayout s1{one.ids.data(), one.loss.data(), int64_t(one.ids.size()), {{2, 2}}, ll.ids()};
  EXPECT_EQ(full_length(s1), 1 + 47 - 1 + 4 + 1);
  const Sample e1 = expand_layout(s1, 0, full_length(s1), nullptr, 2, ImageLoad::Skip);
  std::vector<int32_t> want1 = {1};
  want1.insert(want1.end(), system.begin(), system.end());
  for (int32_t id : {294, 612, 594, pad, pad, pad, pad, 594, 13, 542, 273, 368, 263, 296, 626,
                     297, 612, 264, 293, 325, 611, 2})
    want1.push_back(id);
  EXPECT_EQ(e1.tokens, want1);
  EXPECT_EQ(e1.loss_mask, mask(int(want1.size()) - 5, 5));
  const std::vector<ImageSpan> spans = image_spans(s1);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].first, 1 + 32);  // <bos> and the 32 ids before the placeholder
  EXPECT_EQ(spans[0].tokens, 4);
}

// The same layouts composed from the tokenizer's own encodings: what each template promises
// (the pieces LLaVA tokenizes separately), independent of the numbers above.
TEST_F(TokenizerTest, TemplatesAreTheDocumentedPieces) {
  const Tokenizer ll(llama());
  auto enc = [&](const std::string& t) { return ll.encode(t); };
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const std::string sys(kVicunaSystem);
  EXPECT_EQ(lay(ChatTemplate::LlavaV1, kTwoTurns, ll).ids,
            cat({enc(sys + " USER: "), {-1}, enc("\nWhat is in the image? ASSISTANT:"),
                 enc("A red circle."), {ll.ids().eos}, enc("USER: What color is it? ASSISTANT:"),
                 enc("It is red.")}));
  // A first system turn replaces the system line; a turn's one <image> goes to its front, on a
  // line of its own, as LLaVA's preprocess_multimodal puts it.
  const Laid custom = lay(ChatTemplate::LlavaV1,
                          {{"system", "Be brief."}, {"human", "Hi <image>"}, {"gpt", "A circle."}}, ll);
  EXPECT_EQ(custom.ids, cat({enc("Be brief. USER: "), {-1}, enc("\nHi ASSISTANT:"), enc("A circle.")}));
  // Two images in one turn stay where they stand.
  EXPECT_EQ(lay(ChatTemplate::LlavaV1, {{"human", "Hi <image> and <image>"}, {"gpt", "A circle."}}, ll).ids,
            cat({enc(sys + " USER: Hi "), {-1}, enc(" and "), {-2}, enc(" ASSISTANT:"), enc("A circle.")}));
  // vicuna_v1: the same with Vicuna's own system line.
  EXPECT_EQ(lay(ChatTemplate::VicunaV1, kTwoTurns, ll).ids,
            cat({enc(std::string(kVicunaUserSystem) + " USER: "), {-1}, enc("\nWhat is in the image? ASSISTANT:"),
                 enc("A red circle."), {ll.ids().eos}, enc("USER: What color is it? ASSISTANT:"),
                 enc("It is red.")}));
  // Two images in two human turns are numbered in order.
  const Laid imgs = lay(ChatTemplate::LlavaV1,
                        {{"human", "<image>"}, {"gpt", "a"}, {"human", "<image>"}, {"gpt", "b"}}, ll);
  EXPECT_EQ(std::count(imgs.ids.begin(), imgs.ids.end(), -1), 1);
  EXPECT_EQ(std::count(imgs.ids.begin(), imgs.ids.end(), -2), 1);
  // dhp's template with a Llama tokenizer: today's turn rule, no markers in the layout.
  EXPECT_EQ(lay(ChatTemplate::Dhp, kOneTurn, ll).ids,
            cat({{-1}, enc("What is in the image?"), enc("A red circle.")}));
  // plain drops the instruction text and keeps its images.
  EXPECT_EQ(lay(ChatTemplate::Plain, {{"human", "<image><image> Describe."}, {"gpt", "Two."}}, ll).ids,
            cat({{-1, -2}, enc("Two.\n")}));
}

// LLaVA's own code (tests/reference/llava_ids.py: train.py's preprocess_multimodal,
// preprocess_v1 / preprocess_plain and tokenizer_image_token over transformers' slow
// LlamaTokenizer on the real sentencepiece) gives the same input ids and labels as dhp's
// llava_v1, vicuna_v1 and plain layouts, with the tokenizer's legacy flag absent (true) and
// false: the flag changes the ids after each </s>, and both follow it.
TEST_F(TokenizerTest, LlavaTemplatesGiveLlavasOwnIds) {
  const std::string ref = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/llava_ids.py";
  int compared_labels = 0, ids_differ = 0;
  std::map<std::string, std::vector<std::vector<int32_t>>> by_flag;
  for (const bool legacy : {true, false}) {
    const fs::path dir = llama_folder(legacy ? "llava_legacy" : "llava_nonlegacy", "");
    if (!legacy) write_text(dir / "tokenizer_config.json", R"({"legacy": false, "tokenizer_class": "LlamaTokenizer"})");
    const Tokenizer tok(dir.string(), "none");
    ASSERT_FALSE(tok.images_in_text());
    for (const auto& [t, records] : {std::pair{ChatTemplate::LlavaV1, llava_v1_records()},
                                     std::pair{ChatTemplate::VicunaV1, llava_v1_records()},
                                     std::pair{ChatTemplate::Plain, plain_records()}}) {
      const std::string name(template_name(t));
      SCOPED_TRACE(name + (legacy ? " legacy" : " legacy=false"));
      const fs::path in = dir / (name + ".jsonl"), out = dir / (name + ".ids.jsonl");
      write_text(in, llava_records_jsonl(records));
      const std::string cmd = fmt::format("{} {} {} {} {} 2>/dev/null", ref, name, dir.string(), in.string(), out.string());
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << ": needs Debian's python3-sentencepiece";
      std::istringstream lines(read_text(out));
      for (const LlavaRecord& r : records) {
        std::string line;
        ASSERT_TRUE(std::getline(lines, line));
        const auto want = nlohmann::json::parse(line);
        const Laid laid = lay(t, r.turns, tok);
        const auto [ids, labels] = as_llava_ids(laid.ids, laid.loss, tok.ids(), -200, t != ChatTemplate::Plain);
        EXPECT_EQ(ids, want["input_ids"].get<std::vector<int32_t>>()) << r.turns[0].value;
        by_flag[name + r.turns[0].value].push_back(ids);
        // LLaVA masks every label when its length check disagrees with its own count (its
        // round_len -= 1 for legacy=false assumes Llama-2's pieces, where "USER" is one piece
        // fewer than "▁USER"; the fixture's pieces differ): then only the ids are compared.
        const auto want_labels = want["labels"].get<std::vector<int32_t>>();
        if (std::all_of(want_labels.begin(), want_labels.end(), [](int32_t v) { return v == -100; })) continue;
        EXPECT_EQ(labels, want_labels) << r.turns[0].value;
        ++compared_labels;
      }
    }
  }
  for (const auto& [key, both] : by_flag) ids_differ += both.size() == 2 && both[0] != both[1];
  EXPECT_GE(compared_labels, 14);
  EXPECT_GE(ids_differ, 6);  // negative control: the flag matters on every conversation of two rounds
}

// The chat_template an export writes (jinja_chat_template), rendered as transformers'
// apply_chat_template renders it (tests/reference/render_chat_template.py, Jinja2) and
// tokenized as transformers' slow LlamaTokenizer does (llava_ids.py encode), gives the ids
// of dhp's layout, for a tokenizer holding <image> (as an export's does) with legacy absent
// and false.
TEST_F(TokenizerTest, ExportedChatTemplatesRenderTheLayout) {
  const std::string ref = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/";
  int compared = 0;
  for (const bool legacy : {true, false}) {
    const int n = sp_size(llama());
    const fs::path dir = llama_folder(legacy ? "jinja_legacy" : "jinja_nonlegacy",
                                      fmt::format("{{\"<image>\": {}, \"<pad>\": {}}}", n, n + 1));
    for (const ChatTemplate t : {ChatTemplate::LlavaV1, ChatTemplate::VicunaV1, ChatTemplate::Plain}) {
      const std::string name(template_name(t));
      SCOPED_TRACE(name + (legacy ? " legacy" : " legacy=false"));
      nlohmann::json cfg = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"chat_template", jinja_chat_template(t, legacy)}};
      if (!legacy) cfg["legacy"] = false;
      write_text(dir / "tokenizer_config.json", cfg.dump());
      const Tokenizer tok(dir.string());
      ASSERT_TRUE(tok.images_in_text());
      const auto records = t == ChatTemplate::Plain ? plain_records() : llava_v1_records();
      std::string texts;
      for (size_t i = 0; i < records.size(); ++i) {
        nlohmann::json messages = nlohmann::json::array();
        for (const Turn& turn : records[i].turns)
          messages.push_back({{"role", turn.answer() ? "assistant" : "user"}, {"content", turn.value}});
        const fs::path conv = dir / fmt::format("{}-{}.json", name, i), out = dir / fmt::format("{}-{}.txt", name, i);
        write_text(conv, messages.dump());
        const std::string cmd = ref + "render_chat_template.py " + (dir / "tokenizer_config.json").string() + " " +
                                conv.string() + " " + out.string();
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << ": needs Debian's python3-jinja2";
        texts += nlohmann::json(read_text(out)).dump() + "\n";
      }
      write_text(dir / (name + ".texts.jsonl"), texts);
      const std::string cmd = ref + "llava_ids.py encode " + dir.string() + " " + (dir / (name + ".texts.jsonl")).string() +
                              " " + (dir / (name + ".ids")).string();
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      std::istringstream lines(read_text(dir / (name + ".ids")));
      for (const LlavaRecord& r : records) {
        std::string line;
        ASSERT_TRUE(std::getline(lines, line));
        std::vector<int32_t> want;
        std::istringstream row(line);
        for (int32_t v; row >> v;) want.push_back(v);
        const Laid laid = lay(t, r.turns, tok);
        EXPECT_EQ(as_llava_ids(laid.ids, laid.loss, tok.ids(), n, true).first, want) << r.turns[0].value;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 24);
  // Negative control: the template of the other legacy flag gives other ids.
  EXPECT_NE(jinja_chat_template(ChatTemplate::LlavaV1, true), jinja_chat_template(ChatTemplate::LlavaV1, false));
  EXPECT_EQ(jinja_chat_template(ChatTemplate::Dhp, true), "");
}

// What `dhp generate` feeds the model: the training layout up to where the answer starts.
TEST_F(TokenizerTest, PromptsAreTheTrainingLayoutUpToTheAnswer) {
  const Tokenizer ll(llama());
  const Tokenizer dh(dhp_model());
  const std::string question = kOneTurn[0].value;
  for (const auto& [t, tok] : {std::pair{ChatTemplate::LlavaV1, &ll}, std::pair{ChatTemplate::Dhp, &dh},
                               std::pair{ChatTemplate::Plain, &ll}}) {
    SCOPED_TRACE(std::string(template_name(t)));
    Laid prompt;
    EXPECT_EQ(layout_prompt(t, question, *tok, prompt.ids, prompt.loss), 1);
    const Laid full = lay(t, kOneTurn, *tok);
    const size_t answer = size_t(std::find(full.loss.begin(), full.loss.end(), 1) - full.loss.begin());
    EXPECT_EQ(prompt.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + long(answer)));
    EXPECT_EQ(std::count(prompt.loss.begin(), prompt.loss.end(), 1), 0);
  }
}

TEST_F(TokenizerTest, ConversationsATemplateCannotLayOutAreRefused) {
  const Tokenizer ll(llama());
  auto reason = [&](ChatTemplate t, const std::vector<Turn>& turns) -> std::string {
    try {
      lay(t, turns, ll);
    } catch (const LineError& e) {
      return e.reason + ": " + e.detail;
    }
    return "accepted";
  };
  const std::vector<std::vector<Turn>> bad_v1 = {
      {{"human", "a"}, {"human", "b"}},
      {{"human", "a"}},
      {{"gpt", "a"}, {"human", "b"}},
      {{"human", "a"}, {"gpt", "b"}, {"system", "c"}, {"gpt", "d"}},
  };
  for (const auto& turns : bad_v1)
    EXPECT_TRUE(contains(reason(ChatTemplate::LlavaV1, turns), "alternating")) << turns.size();
  EXPECT_EQ(reason(ChatTemplate::LlavaV1, {{"human", "a"}, {"gpt", "<image>"}}),
            "bad format: an <image> marker in an answer");
  EXPECT_TRUE(contains(reason(ChatTemplate::Plain, kTwoTurns), "one human turn"));
  EXPECT_TRUE(contains(reason(ChatTemplate::Plain, {{"system", "a"}, {"gpt", "b"}}), "one human turn"));
  // Negative control: the same checks pass what the templates take.
  EXPECT_EQ(reason(ChatTemplate::LlavaV1, kTwoTurns), "accepted");
  EXPECT_EQ(reason(ChatTemplate::Plain, kOneTurn), "accepted");
  EXPECT_EQ(parse_template("llava_v1"), ChatTemplate::LlavaV1);
  EXPECT_TRUE(contains(error_of([] { parse_template("vicuna"); }), "dhp, llava_v1, vicuna_v1, plain"));
}

// ---- layouts of whole data sets ------------------------------------------------------------

// Two images and a manifest of three conversations: one image, two images over two rounds,
// none.
fs::path write_manifest(const fs::path& dir) {
  fs::create_directories(dir);
  codecs::write_image((dir / "a.png").string(), cv::Mat(64, 48, CV_8UC3, cv::Scalar(10, 200, 30)));
  codecs::write_image((dir / "b.png").string(), cv::Mat(100, 30, CV_8UC3, cv::Scalar(90, 20, 250)));
  std::ofstream out(dir / "m.jsonl");
  out << R"({"id": "one", "image": "a.png", "conversations": [{"from": "human", "value": "<image>\nWhat is in the image?"}, {"from": "gpt", "value": "A red circle."}]})" "\n"
      << R"({"id": "two", "images": ["a.png", "b.png"], "conversations": [{"from": "human", "value": "<image>\nWhat is in the image?"}, {"from": "gpt", "value": "A red circle."}, {"from": "human", "value": "And here? <image>"}, {"from": "gpt", "value": "A blue square."}]})" "\n"
      << R"({"id": "none", "conversations": [{"from": "human", "value": "What color is it?"}, {"from": "gpt", "value": "It is red."}]})" "\n";
  return dir / "m.jsonl";
}

// Every sample, whole and in pieces, agrees with the lengths the index predicted.
void expect_consistent(const Dataset& ds, const SpecialIds& ids) {
  for (int64_t i = 0; i < ds.size(); ++i) {
    SCOPED_TRACE(ds.name(i));
    const Sample s = ds.load(i, false);
    const int64_t L = ds.length(i);
    ASSERT_EQ(int64_t(s.tokens.size()), L);
    EXPECT_EQ(s.tokens.front(), ids.bos);
    EXPECT_EQ(s.tokens.back(), ids.eos);
    EXPECT_EQ(std::count_if(s.image_of.begin(), s.image_of.end(), [](int32_t k) { return k >= 0; }),
              ds.vision_tokens(i));
    EXPECT_EQ(std::accumulate(s.loss_mask.begin(), s.loss_mask.end(), int64_t(0)), ds.loss_tokens(i));
    EXPECT_EQ(int64_t(s.images.size()), ds.images(i));
    const int64_t begins = ids.markers() ? std::count(s.tokens.begin(), s.tokens.end(), ids.img_begin) : 0;
    EXPECT_EQ(begins, ids.markers() ? ds.images(i) : 0);
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.image_of[t] >= 0) {
        EXPECT_EQ(s.tokens[t], ids.pad);
      }
    }
    const std::vector<ImageSpan> spans = ds.image_spans(i);
    ASSERT_EQ(int64_t(spans.size()), ds.images(i));
    for (size_t k = 0; k < spans.size(); ++k) {
      EXPECT_EQ(s.image_of[size_t(spans[k].first)], int32_t(k));
      EXPECT_EQ(s.image_of[size_t(spans[k].first + spans[k].tokens - 1)], int32_t(k));
      if (ids.markers()) {
        EXPECT_EQ(s.tokens[size_t(spans[k].first - 1)], ids.img_begin);
      }
    }
    for (int64_t a = 0; a < L; a += 3)
      for (int64_t b : {a + 1, a + 7, L}) {
        if (b > L) continue;
        const Sample piece = ds.load_range(i, a, b, false);
        const Sample want = slice_sample(s, a, b);
        EXPECT_EQ(piece.tokens, want.tokens) << a << ".." << b;
        EXPECT_EQ(piece.loss_mask, want.loss_mask) << a << ".." << b;
        EXPECT_EQ(piece.image_of, want.image_of) << a << ".." << b;
        EXPECT_EQ(piece.next_target, want.next_target) << a << ".." << b;
      }
  }
}

TEST_F(TokenizerTest, LayoutLengthsAgreeWithExpandedSamplesWithAndWithoutMarkers) {
  const fs::path manifest = write_manifest(*root_ / "set");
  const ImageGeometry g;
  const Tokenizer dh(dhp_model());
  const Tokenizer ll(llama());
  const JsonlDataset with(manifest.string(), "", dh, g, 4096, "fail");
  ASSERT_EQ(with.size(), 3);
  expect_consistent(with, dh.ids());
  const JsonlDataset without(manifest.string(), "", ll, g, 4096, "fail", kDefaultMaxImagePixels,
                             false, nullptr, ChatTemplate::LlavaV1);
  ASSERT_EQ(without.size(), 3);
  expect_consistent(without, ll.ids());
  const JsonlDataset plain(manifest.string(), "", ll, g, 4096, "skip", kDefaultMaxImagePixels,
                           false, nullptr, ChatTemplate::Plain);
  EXPECT_EQ(plain.size(), 2);  // the two-round line is not a caption
  EXPECT_EQ(plain.skipped().at("bad format"), 1);
  expect_consistent(plain, ll.ids());
  // The dhp template with a Llama-style model: the same layout rule without markers.
  const JsonlDataset dhp_ll(manifest.string(), "", ll, g, 4096, "fail");
  expect_consistent(dhp_ll, ll.ids());

  // Data that goes bad after indexing becomes a placeholder of the table's pad.
  const JsonlDataset skipping(manifest.string(), "", ll, g, 4096, "skip", kDefaultMaxImagePixels,
                              false, nullptr, ChatTemplate::LlavaV1);
  fs::remove(*root_ / "set" / "b.png");
  const Sample p = skipping.load(1, false);
  EXPECT_TRUE(p.skipped);
  EXPECT_EQ(int64_t(p.tokens.size()), skipping.length(1));
  EXPECT_EQ(std::count(p.tokens.begin(), p.tokens.end(), ll.ids().pad), skipping.length(1));
  EXPECT_NE(ll.ids().pad, 0);  // not dhp's pad: the table's
}

TEST_F(TokenizerTest, ShardsRecordTheirTemplateAndTokenizer) {
  const fs::path manifest = write_manifest(*root_ / "shard_set");
  const Tokenizer ll(llama());
  BuildOptions o;
  o.manifest = manifest.string();
  o.out_dir = (*root_ / "built").string();
  o.tokenizer = llama();
  o.chat = ChatTemplate::LlavaV1;
  o.progress = false;
  ASSERT_TRUE(build_dataset(o).complete);
  EXPECT_EQ(read_index(o.out_dir).chat_template, "llava_v1");
  const ImageGeometry g;
  const ShardDataset built(o.out_dir, ll, g, 4096, "fail", kDefaultMaxImagePixels, ChatTemplate::LlavaV1);
  const JsonlDataset direct(manifest.string(), "", ll, g, 4096, "fail", kDefaultMaxImagePixels,
                            false, nullptr, ChatTemplate::LlavaV1);
  ASSERT_EQ(built.size(), direct.size());
  for (int64_t i = 0; i < built.size(); ++i) {
    EXPECT_EQ(built.length(i), direct.length(i));
    EXPECT_EQ(built.load(i, false).tokens, direct.load(i, false).tokens);
  }
  expect_consistent(built, ll.ids());

  std::string msg = error_of([&] { ShardDataset s(o.out_dir, ll, g, 4096, "fail"); });
  EXPECT_TRUE(contains(msg, "chat template 'llava_v1'")) << msg;
  EXPECT_TRUE(contains(msg, "data.template is 'dhp'")) << msg;
  const Tokenizer other(llama(), "none");
  msg = error_of([&] {
    ShardDataset s(o.out_dir, other, g, 4096, "fail", kDefaultMaxImagePixels, ChatTemplate::LlavaV1);
  });
  EXPECT_TRUE(contains(msg, "another tokenizer")) << msg;
  // A rerun with another template is another build.
  BuildOptions again = o;
  again.chat = ChatTemplate::Plain;
  EXPECT_TRUE(contains(error_of([&] { build_dataset(again); }), "other inputs or settings"));
}

// ---- checkpoints ---------------------------------------------------------------------------

TEST_F(TokenizerTest, ResumeChecksTheRecordedTableAndAddedTokens) {
  const Tokenizer dh(dhp_model());
  const Tokenizer ll(llama());
  auto state_of = [](const Tokenizer& t) {
    TrainState st;
    st.tokenizer_hash = t.hash();
    st.special_ids = format_special_ids(t.ids());
    st.added_tokens = format_added_tokens(t.added_tokens());
    return st;
  };
  EXPECT_NO_THROW(check_tokenizer("ck.h5", state_of(ll), ll));
  EXPECT_NO_THROW(check_tokenizer("ck.h5", state_of(dh), dh));
  std::string msg = error_of([&] { check_tokenizer("ck.h5", state_of(dh), ll); });
  EXPECT_TRUE(contains(msg, "bos is 2 in the checkpoint, 1 now")) << msg;
  EXPECT_TRUE(contains(msg, "pad is 0 in the checkpoint")) << msg;
  // Other added tokens with the same table: named as such.
  const Tokenizer more(llama(), "<image>,<pad>,<video>");
  msg = error_of([&] { check_tokenizer("ck.h5", state_of(ll), more); });
  EXPECT_TRUE(contains(msg, "added tokens [[\"<image>\"")) << msg;
  EXPECT_TRUE(contains(msg, "\"<video>\"")) << msg;
  // A checkpoint from before the records: today's table, so dhp's model resumes and a
  // Llama-style one is refused.
  TrainState old;
  old.tokenizer_hash = dh.hash();
  EXPECT_NO_THROW(check_tokenizer("old.h5", old, dh));
  old.tokenizer_hash = 0;
  msg = error_of([&] { check_tokenizer("old.h5", old, ll); });
  EXPECT_TRUE(contains(msg, "other special token ids")) << msg;
}

}  // namespace
}  // namespace dhp
