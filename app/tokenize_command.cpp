// `dhp tokenize`: what the run's tokenizer makes of text, one output line per input line, so a
// user can check their data (and tests and benches can drive the tokenizer from outside).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "app/cli.h"
#include "core/check.h"
#include "core/input.h"
#include "core/log.h"
#include "core/text.h"
#include "data/chat_template.h"
#include "data/manifest.h"
#include "data/tokenizer.h"

namespace dhp {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string added_tokens = "auto";
  std::string chat;  // "" = the text as it is
  std::vector<std::string> texts;
  std::string file;
  bool ids = false;
  bool pieces = false;
};

// One line's output: its ids (or tokens) as the model would read them. With a template the
// line is a prompt laid out as `dhp generate` lays it out (bos, the template's text up to where
// the answer starts); each image stands as "<image>", its size being unknown here.
std::string tokenize_line(const TokenizeOptions& o, const Tokenizer& tok, const std::string& line) {
  std::vector<int32_t> ids;
  if (o.chat.empty()) {
    ids = tok.encode(line);
  } else {
    std::vector<int32_t> layout;
    std::vector<uint8_t> loss;
    try {
      layout_prompt(parse_template(o.chat), line, tok, layout, loss);
    } catch (const LineError& e) {
      throw Error(fmt::format("--template {}: {}", o.chat, e.detail));
    }
    if (tok.ids().has_bos()) ids.push_back(tok.ids().bos);
    for (const int32_t v : layout) {
      if (v >= 0) {
        ids.push_back(v);
        continue;
      }
      // An image: its markers, if the tokenizer has them, around one stand-in.
      if (tok.ids().markers()) ids.push_back(tok.ids().img_begin);
      ids.push_back(-1);
      if (tok.ids().markers()) ids.push_back(tok.ids().img_end);
    }
  }
  std::string out;
  for (const int32_t id : ids) {
    if (!out.empty()) out += ' ';
    if (id < 0)
      out += "<image>";
    else
      out += o.pieces ? printable(tok.token_text(id)) : std::to_string(id);
  }
  return out;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand(
      "tokenize", "Print the ids (or tokens) a tokenizer gives each line of text, one line each");
  sub->add_option("--tokenizer", o->tokenizer,
                   "tokenizer.model, tokenizer.json, or a folder holding one")
      ->required();
  sub->add_option("--added-tokens", o->added_tokens,
                  "auto | none | a comma-separated list (as data.added_tokens)")
      ->capture_default_str();
  sub->add_option("--template", o->chat,
                  "Lay each line out as a prompt of this chat template (dhp, llava_v1, plain, ...)");
  auto* text = sub->add_option("--text", o->texts, "Text to tokenize (repeat for several lines)");
  auto* file = sub->add_option("--file", o->file, "File whose every line is tokenized");
  text->excludes(file);
  auto* ids = sub->add_flag("--ids", o->ids, "Print ids (the default)");
  sub->add_flag("--pieces", o->pieces, "Print the tokens instead of their ids")->excludes(ids);
  sub->callback([o, text, file] {
    set_up_logging(0, 1, "warn");
    DHP_CHECK(text->count() + file->count() > 0, "tokenize: give --text or --file");
    const Tokenizer tok(o->tokenizer, o->added_tokens);
    for (const std::string& line : o->texts) fmt::print("{}\n", tokenize_line(*o, tok, line));
    if (o->file.empty()) return;
    LineReader lines("text file", o->file);
    for (std::string line; lines.next(line);) fmt::print("{}\n", tokenize_line(*o, tok, line));
  });
}

}  // namespace dhp
