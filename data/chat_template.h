// Chat templates: how a conversation's turns become the stored layout (text ids with one
// placeholder -(k+1) per image; <bos> and the final <eos> are added by expand_layout).
//   dhp       model-spec.md's layout: each turn's trimmed text, images where their <image>
//             markers stand, loss on the answers (and the final <eos>).
//   llava_v1  Vicuna v1.1 as LLaVA-1.5 trains it:
//               <bos>{system} USER: {human} ASSISTANT: {gpt}</s>USER: {human} ASSISTANT: {gpt}</s>
//             with each image's tokens where its <image> marker stands (a turn's one
//             <image> moved to its front and followed by "\n", as LLaVA's
//             preprocess_multimodal does); loss on every answer and the </s> (<eos>) after it.
//   vicuna_v1 the same with Vicuna's own system line (LLaVA's conv_vicuna_v1: "...a curious
//             user ... the user's questions."), which LLaVA-1.5's finetune.sh selects with
//             --version v1.
//   plain     LLaVA's pretraining stage: the human turn's images, then the caption and "\n"
//             (LLaVA's separator), then <eos>; the human turn's text is dropped; loss on the
//             caption, its "\n" and <eos>.
//   chatml    Qwen's (as Qwen3's tokenizer_config.json renders a conversation without tools):
//               <|im_start|>system\n{system}<|im_end|>\n   (only when the data has one)
//               <|im_start|>user\n{human}<|im_end|>\n<|im_start|>assistant\n{gpt}<|im_end|>\n ...
//             the last answer after the last user turn opening with "<think>\n\n</think>\n\n"
//             (Qwen3's empty reasoning; not a target); images as <|vision_start|> N x
//             <|image_pad|> <|vision_end|> where their <image> stood; loss on every answer and
//             its <|im_end|>.
//   internvl2_5  InternVL2.5's and InternVL3's (InternVL's preprocess_internvl2_5): chatml
//             with a system turn always, InternVL's own line (kInternVlSystem) unless the data
//             has one, no reasoning opening; images as <img> N x <IMG_CONTEXT> </img> where
//             their <image> stood, N the tokens of all of the image's tiles; loss on every
//             answer and its <|im_end|>.
//   llama3    Llama-3's: <|begin_of_text|> then, per turn,
//               <|start_header_id|>{role}<|end_header_id|>\n\n{text, trimmed}<|eot_id|>
//             loss on every answer and its <|eot_id|>.
//             For both, the last answer's end token is the sample's closing <eos> when the
//             tokenizer's eos is that token (Qwen3's and Llama-3.1-Instruct's files); with
//             another eos (a base model's <|endoftext|>) the end token is followed by it. The
//             final "\n" chatml writes after the last <|im_end|> is not part of the sample.
// Each piece of text between images, answers and <eos> is encoded by the tokenizer on its own
// (as LLaVA tokenizes the chunks around its image token), so SentencePiece's word-boundary
// prefix starts each piece, except where the tokenizer's own code continues a text: after an
// <eos> (a tokenizer with legacy=false puts no prefix there, as LLaVA's prompt meets it) and,
// when <image> is a token of the tokenizer's own files (llava-hf), after an image.
// docs/data.md shows every template with the ids it gives.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dhp {

class Tokenizer;

enum class ChatTemplate { Dhp, LlavaV1, VicunaV1, Plain, ChatMl, Llama3, InternVl };

inline constexpr std::array<std::pair<ChatTemplate, std::string_view>, 7> kChatTemplateNames = {{
    {ChatTemplate::Dhp, "dhp"},
    {ChatTemplate::LlavaV1, "llava_v1"},
    {ChatTemplate::VicunaV1, "vicuna_v1"},
    {ChatTemplate::Plain, "plain"},
    {ChatTemplate::ChatMl, "chatml"},
    {ChatTemplate::Llama3, "llama3"},
    {ChatTemplate::InternVl, "internvl2_5"},
}};

std::string_view template_name(ChatTemplate t);
// Throws dhp::Error for a name that is not in kChatTemplateNames, listing them.
ChatTemplate parse_template(std::string_view name);

// The marker that places the next image in a human turn.
inline constexpr std::string_view kImageMarker = "<image>";

// The system line of Vicuna v1.1 (llava_v1), used unless the conversation starts with a
// "system" turn.
inline constexpr std::string_view kVicunaSystem =
    "A chat between a curious human and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the human's questions.";
// vicuna_v1's (LLaVA's conv_vicuna_v1).
inline constexpr std::string_view kVicunaUserSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions.";

// internvl2_5's system line (InternVL's conversation template "internvl2_5"), used unless the
// conversation starts with a "system" turn.
inline constexpr std::string_view kInternVlSystem =
    "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。";

struct Turn {
  std::string from;   // "human" | "user" | "system" | "gpt" | "assistant"
  std::string value;
  bool answer() const { return from == "gpt" || from == "assistant"; }
};

struct LaidOut {
  int64_t markers = 0;         // <image> markers placed (images the conversation uses)
  int64_t answer_tokens = 0;   // answer text tokens (loss-carrying, <eos> tokens excluded)
};

// Appends the conversation to layout/loss under template `t`. Throws LineError ("bad format")
// for a conversation the template cannot lay out (naming why), or for a marker in an answer.
LaidOut layout_conversation(ChatTemplate t, const std::vector<Turn>& turns, const Tokenizer& tok,
                            std::vector<int32_t>& layout, std::vector<uint8_t>& loss);

// transformers' chat_template (Jinja, as apply_chat_template renders it: messages of role
// system/user/assistant with string content, `<image>` markers in the text) that renders a
// conversation to the text whose ids, under a LlamaTokenizer with this `legacy` flag, are the
// template's layout here: llava_v1, vicuna_v1 and plain; "" for the others (dhp's own layout
// has no text form; chatml and llama3 tokenizers carry their family's).
std::string jinja_chat_template(ChatTemplate t, bool legacy);

// The layout of a one-turn prompt for generation, up to where the answer starts (for
// llava_v1: the system line, " USER: {prompt} ASSISTANT:"). Returns the markers placed.
int64_t layout_prompt(ChatTemplate t, const std::string& prompt, const Tokenizer& tok,
                      std::vector<int32_t>& layout, std::vector<uint8_t>& loss);

}  // namespace dhp
