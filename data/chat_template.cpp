#include "data/chat_template.h"

#include <fmt/format.h>

#include "core/check.h"
#include "data/manifest.h"
#include "data/tokenizer.h"
#include "data/video.h"

namespace dhp {

namespace {

int64_t count_markers(const std::string& text) {
  int64_t n = 0;
  for (size_t at = text.find(kImageMarker); at != std::string::npos;
       at = text.find(kImageMarker, at + kImageMarker.size()))
    ++n;
  return n;
}

// Where the next <image> (or, when allowed, <video>) marker at or after `at` starts; npos when
// none. *video says which it is.
size_t next_marker(const std::string& text, size_t at, bool allow_video, bool* video) {
  const size_t image = text.find(kImageMarker, at);
  const size_t clip = allow_video ? text.find(kVideoTag, at) : std::string::npos;
  *video = clip < image;
  return std::min(image, clip);
}

size_t marker_size(bool video) { return video ? kVideoTag.size() : kImageMarker.size(); }

void push(std::vector<int32_t>& layout, std::vector<uint8_t>& loss, const std::vector<int32_t>& ids,
          bool answer) {
  layout.insert(layout.end(), ids.begin(), ids.end());
  loss.insert(loss.end(), ids.size(), uint8_t(answer));
}

// Encodes `text` chunk by chunk around its <image> markers (as they stand: LLaVA keeps the
// spaces and newlines next to its image token), each marker becoming the next placeholder
// (a <video> marker kVideoMarker, when allowed: parse_line expands it into frames). The text
// after a marker continues the text before it when <image> is a token of the tokenizer's own
// files (llava-hf's processor tokenizes the whole prompt); else each chunk is a text of its
// own, as LLaVA's tokenizer_image_token encodes them. `continues`: the first chunk follows a
// special token (an <eos>).
int64_t encode_with_images(const std::string& text, const Tokenizer& tok, int64_t markers_before,
                           std::vector<int32_t>& layout, std::vector<uint8_t>& loss,
                           bool allow_video = false, bool continues = false) {
  int64_t k = 0;
  size_t at = 0;
  for (;;) {
    bool video = false;
    const size_t next = next_marker(text, at, allow_video, &video);
    push(layout, loss,
         tok.encode(text.substr(at, next == std::string::npos ? std::string::npos : next - at),
                    at == 0 ? continues : tok.images_in_text()),
         false);
    if (next == std::string::npos) return k;
    layout.push_back(video ? kVideoMarker : -int32_t(markers_before + ++k));
    loss.push_back(0);
    at = next + marker_size(video);
  }
}

int64_t answer_text(const Turn& turn, const Tokenizer& tok, std::vector<int32_t>& layout,
                    std::vector<uint8_t>& loss, bool continues = false) {
  if (turn.value.find(kImageMarker) != std::string::npos)
    throw LineError{"bad format", "an <image> marker in an answer"};
  if (turn.value.find(kVideoTag) != std::string::npos)
    throw LineError{"bad format", "a <video> marker in an answer"};
  const std::vector<int32_t> ids = tok.encode(turn.value, continues);
  push(layout, loss, ids, true);
  return int64_t(ids.size());
}

// Python's str.strip(): the characters str.isspace() accepts, ASCII and Unicode. (Jinja's `trim`
// filter is this strip, so the llama3 template's `| trim` uses it too.)
std::string python_strip(const std::string& s) {
  static const std::string_view kSpaces[] = {
      " ", "\t", "\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0", "\u1680",
      "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009",
      "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  auto space_at = [&](std::string_view t, bool front) -> size_t {
    for (std::string_view sp : kSpaces)
      if (t.size() >= sp.size() && t.substr(front ? 0 : t.size() - sp.size(), sp.size()) == sp) return sp.size();
    return 0;
  };
  std::string_view t = s;
  for (size_t n; (n = space_at(t, true)) > 0;) t.remove_prefix(n);
  for (size_t n; (n = space_at(t, false)) > 0;) t.remove_suffix(n);
  return std::string(t);
}

// LLaVA's preprocess_multimodal: a turn holding one <image> has it moved to its front, on a
// line of its own ("<image>\n" + the rest, stripped). Turns with several images or a video
// (dhp's own; LLaVA has one image) keep their markers where they stand.
std::string image_first(const std::string& value) {
  if (count_markers(value) != 1 || value.find(kVideoTag) != std::string::npos) return value;
  std::string rest = value;
  rest.erase(rest.find(kImageMarker), kImageMarker.size());
  return python_strip(std::string(kImageMarker) + "\n" + python_strip(rest));
}

std::string_view vicuna_system(ChatTemplate t) { return t == ChatTemplate::VicunaV1 ? kVicunaUserSystem : kVicunaSystem; }

LaidOut layout_llava_v1(ChatTemplate t, const std::vector<Turn>& turns, const Tokenizer& tok,
                        std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  std::string system(vicuna_system(t));
  size_t first = 0;
  if (!turns.empty() && turns[0].from == "system") system = turns[0].value, first = 1;
  const size_t n = turns.size() - first;
  bool alternating = n > 0 && n % 2 == 0;
  for (size_t i = first; i < turns.size() && alternating; ++i)
    alternating = turns[i].answer() == ((i - first) % 2 == 1) && turns[i].from != "system";
  if (!alternating)
    throw LineError{"bad format",
                    "the llava_v1 and vicuna_v1 templates take alternating human and gpt turns, starting "
                    "with human and ending with gpt (after an optional first system turn)"};
  LaidOut out;
  for (size_t r = 0; r < n / 2; ++r) {
    const Turn& human = turns[first + 2 * r];
    const std::string instruction =
        (r == 0 ? system + " " : std::string()) + "USER: " + image_first(human.value) + " ASSISTANT:";
    // Rounds after the first follow the previous answer's </s> in LLaVA's prompt.
    out.markers += encode_with_images(instruction, tok, out.markers, layout, loss,
                                      /*allow_video=*/true, /*continues=*/r > 0);
    out.answer_tokens += answer_text(turns[first + 2 * r + 1], tok, layout, loss);
    // The last answer's </s> is the document's closing <eos> (expand_layout adds it).
    if (2 * r + 2 < n) {
      layout.push_back(tok.ids().eos);
      loss.push_back(1);
    }
  }
  return out;
}

LaidOut layout_plain(const std::vector<Turn>& turns, const Tokenizer& tok,
                     std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  if (turns.size() != 2 || turns[0].answer() || turns[0].from == "system" || !turns[1].answer())
    throw LineError{"bad format",
                    "the plain template takes one human turn (its images) and one gpt turn "
                    "(the caption)"};
  LaidOut out;
  // The human turn's text is LLaVA's placeholder instruction: only its images (and videos)
  // are kept, in marker order.
  const std::string& human = turns[0].value;
  bool video = false;
  for (size_t at = next_marker(human, 0, true, &video); at != std::string::npos;
       at = next_marker(human, at + marker_size(video), true, &video)) {
    layout.push_back(video ? kVideoMarker : -int32_t(++out.markers));
    loss.push_back(0);
  }
  // LLaVA's preprocess_plain: "<image>" + caption + "\n", the caption and its newline the
  // targets (dhp's closing <eos> follows: the document boundary of packed sequences).
  out.answer_tokens = answer_text(Turn{turns[1].from, turns[1].value + "\n"}, tok, layout, loss,
                                  out.markers > 0 && tok.images_in_text());
  return out;
}

// chatml and llama3: turns framed by the family's special tokens, which the tokenizer holds
// and recognises in text. The frame's text is encoded piece by piece around the turns' text
// (as the plain and llava_v1 layouts are), never across a turn's boundary.
struct TaggedFamily {
  std::string_view name;
  std::string_view open_before_role, open_after_role;  // around the role's name
  std::string_view end;                                // a turn's end token
  std::string_view after_end;                          // text after it (not a target)
  bool trim = false;                                   // Jinja's `| trim` of each turn's text (python_strip)
  std::string_view last_answer_opening;                // after the last answer's header
  std::string_view default_system;                     // a system turn when the data has none ("": none)
  // The tokens that must frame images ("": the tokenizer's own): InternVL's <img> and </img>,
  // which a Qwen tokenizer without them would replace by its vision tokens.
  std::string_view image_begin, image_end;
};

constexpr TaggedFamily kChatMl{"chatml", "<|im_start|>", "\n", "<|im_end|>", "\n", false, "<think>\n\n</think>\n\n",
                               "", "", ""};
constexpr TaggedFamily kLlama3{"llama3", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "", true, "", "",
                               "", ""};
constexpr TaggedFamily kInternVl{"internvl2_5", "<|im_start|>", "\n", "<|im_end|>", "\n", false, "", kInternVlSystem,
                                 "<img>", "</img>"};

// The conversation with the family's default system turn first when it has one and the data
// does not.
std::vector<Turn> with_system(const TaggedFamily& f, const std::vector<Turn>& turns) {
  if (f.default_system.empty() || (!turns.empty() && turns[0].from == "system")) return turns;
  std::vector<Turn> out = {Turn{"system", std::string(f.default_system)}};
  out.insert(out.end(), turns.begin(), turns.end());
  return out;
}

std::string role_of(const Turn& t) {
  if (t.answer()) return "assistant";
  return t.from == "system" ? "system" : "user";
}

// The family's tokens must be tokens of the tokenizer: as text they would be split into pieces
// and the model would be trained on something its family never reads.
int32_t family_token(const TaggedFamily& f, std::string_view text, const Tokenizer& tok) {
  const int32_t id = tok.token_id(std::string(text));
  if (id < 0)
    throw Error(fmt::format("data.template = \"{}\" needs the token {} in the tokenizer '{}', which has "
                            "none: use the template of the tokenizer's family",
                            f.name, text, tok.path()));
  return id;
}

LaidOut layout_tagged(const TaggedFamily& f, const std::vector<Turn>& given, const Tokenizer& tok,
                      std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  const std::vector<Turn> turns = with_system(f, given);
  const int32_t end = family_token(f, f.end, tok);
  if (!f.image_begin.empty() &&
      (tok.ids().img_begin != family_token(f, f.image_begin, tok) || tok.ids().img_end != family_token(f, f.image_end, tok)))
    throw Error(fmt::format("data.template = \"{}\" frames images with {} and {}, which the tokenizer '{}' does not "
                            "use for images", f.name, f.image_begin, f.image_end, tok.path()));
  family_token(f, f.open_before_role, tok);
  if (turns.empty() || !turns.back().answer())
    throw LineError{"bad format", fmt::format("the {} template takes a conversation that ends with an answer "
                                              "(a gpt or assistant turn)", f.name)};
  // Qwen3's last_query_index: the last user turn, or the last turn when there is none.
  size_t last_user = turns.size() - 1;
  for (size_t i = turns.size(); i-- > 0;)
    if (!turns[i].answer() && turns[i].from != "system") {
      last_user = i;
      break;
    }
  LaidOut out;
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& turn = turns[i];
    const bool last = i + 1 == turns.size();
    std::string header = std::string(f.open_before_role) + role_of(turn) + std::string(f.open_after_role);
    if (!turn.answer()) {
      const std::string text = f.trim ? python_strip(turn.value) : turn.value;
      out.markers += encode_with_images(header + text + std::string(f.end) + std::string(f.after_end), tok,
                                        out.markers, layout, loss, /*allow_video=*/true);
      continue;
    }
    if (turn.value.find("</think>") != std::string::npos)
      throw LineError{"bad format", "an answer holding </think> (reasoning text is not laid out)"};
    std::string text = f.trim ? python_strip(turn.value) : turn.value;
    if (last && i > last_user && !f.last_answer_opening.empty()) {
      header += f.last_answer_opening;
      text.erase(0, text.find_first_not_of('\n') == std::string::npos ? text.size() : text.find_first_not_of('\n'));
    }
    push(layout, loss, tok.encode(header), false);
    out.answer_tokens += answer_text(Turn{turn.from, text}, tok, layout, loss);
    // The last answer's end token is the sample's closing <eos> when they are one token.
    if (!last || tok.ids().eos != end) {
      layout.push_back(end);
      loss.push_back(1);
      if (!last) push(layout, loss, tok.encode(std::string(f.after_end)), false);
    }
  }
  return out;
}

// The prompt of one user turn, up to where the answer's text starts.
int64_t prompt_tagged(const TaggedFamily& f, const std::string& prompt, const Tokenizer& tok,
                      std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  family_token(f, f.end, tok);
  const std::string text = f.trim ? python_strip(prompt) : prompt;
  const std::string system = f.default_system.empty() ? "" : std::string(f.open_before_role) + "system" +
                                                                 std::string(f.open_after_role) +
                                                                 std::string(f.default_system) + std::string(f.end) +
                                                                 std::string(f.after_end);
  return encode_with_images(system + std::string(f.open_before_role) + "user" + std::string(f.open_after_role) + text +
                                std::string(f.end) + std::string(f.after_end) + std::string(f.open_before_role) +
                                "assistant" + std::string(f.open_after_role) + std::string(f.last_answer_opening),
                            tok, 0, layout, loss);
}

const TaggedFamily* tagged_family(ChatTemplate t) {
  return t == ChatTemplate::ChatMl ? &kChatMl : t == ChatTemplate::Llama3 ? &kLlama3
         : t == ChatTemplate::InternVl ? &kInternVl : nullptr;
}

}  // namespace

std::string jinja_chat_template(ChatTemplate t, bool legacy) {
  // After bos_token, LlamaTokenizer with legacy=false puts no word-boundary prefix before the
  // next text unless it starts with a space; the layout's first piece has one.
  const std::string after_bos = legacy ? "" : " ";
  // preprocess_multimodal: a turn's one <image> to its front, on a line of its own.
  const std::string user_text =
      "{% if m['content'].count('<image>') == 1 and '<video>' not in m['content'] %}"
      "{{ ('<image>\\n' + m['content'].replace('<image>', '').strip()).strip() }}"
      "{% else %}{{ m['content'] }}{% endif %}";
  switch (t) {
    case ChatTemplate::LlavaV1:
    case ChatTemplate::VicunaV1:
      return "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
             "{% set turns = messages[1:] %}{% else %}{% set system = \"" + std::string(vicuna_system(t)) +
             "\" %}{% set turns = messages %}{% endif %}{{ '" + after_bos + "' + system }}"
             "{% for m in turns %}{% if m['role'] == 'user' %}{{ ' USER: ' if loop.first else 'USER: ' }}" +
             user_text + "{{ ' ASSISTANT:' }}{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}";
    case ChatTemplate::Plain:
      return "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
             "{{ '<image>' * m['content'].count('<image>') }}{% else %}{{ m['content'] + '\\n' + eos_token }}"
             "{% endif %}{% endfor %}";
    case ChatTemplate::Dhp:
    case ChatTemplate::ChatMl:
    case ChatTemplate::Llama3:
    case ChatTemplate::InternVl:
      break;
  }
  return "";
}

std::string_view template_name(ChatTemplate t) {
  for (const auto& [value, name] : kChatTemplateNames)
    if (value == t) return name;
  DHP_ASSERT(false);
  return {};
}

ChatTemplate parse_template(std::string_view name) {
  std::string names;
  for (const auto& [value, text] : kChatTemplateNames) {
    if (text == name) return value;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", text);
  }
  throw Error(fmt::format("unknown chat template '{}' (known: {})", name, names));
}

LaidOut layout_conversation(ChatTemplate t, const std::vector<Turn>& turns, const Tokenizer& tok,
                            std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  if (const TaggedFamily* f = tagged_family(t)) return layout_tagged(*f, turns, tok, layout, loss);
  switch (t) {
    case ChatTemplate::LlavaV1:
    case ChatTemplate::VicunaV1:
      return layout_llava_v1(t, turns, tok, layout, loss);
    case ChatTemplate::Plain:
      return layout_plain(turns, tok, layout, loss);
    case ChatTemplate::Dhp:
    case ChatTemplate::ChatMl:
    case ChatTemplate::Llama3:
    case ChatTemplate::InternVl:
      break;
  }
  LaidOut out;
  for (const Turn& turn : turns) {
    const size_t before = layout.size();
    out.markers += append_turn(turn.value, turn.answer(), tok, out.markers, layout, loss,
                               /*allow_video=*/true);
    if (turn.answer()) out.answer_tokens += int64_t(layout.size() - before);  // answers hold no images
  }
  return out;
}

int64_t layout_prompt(ChatTemplate t, const std::string& prompt, const Tokenizer& tok,
                      std::vector<int32_t>& layout, std::vector<uint8_t>& loss) {
  if (const TaggedFamily* f = tagged_family(t)) return prompt_tagged(*f, prompt, tok, layout, loss);
  switch (t) {
    case ChatTemplate::LlavaV1:
    case ChatTemplate::VicunaV1:
      return encode_with_images(std::string(vicuna_system(t)) + " USER: " + image_first(prompt) + " ASSISTANT:",
                                tok, 0, layout, loss);
    case ChatTemplate::Plain: {
      const int64_t markers = count_markers(prompt);
      for (int64_t k = 0; k < markers; ++k) {
        layout.push_back(-int32_t(k + 1));
        loss.push_back(0);
      }
      return markers;
    }
    case ChatTemplate::Dhp:
    case ChatTemplate::ChatMl:
    case ChatTemplate::Llama3:
    case ChatTemplate::InternVl:
      break;
  }
  return append_turn(prompt, false, tok, 0, layout, loss);
}

}  // namespace dhp
