#!/usr/bin/env python3
"""Renders a conversation with the chat_template of a real tokenizer_config.json, as
transformers' apply_chat_template does (Jinja2, trim_blocks and lstrip_blocks on, the
tokenizer's special tokens as variables), for tests/test_tokenizer_json.cpp.

    render_chat_template.py TOKENIZER_CONFIG CONVERSATION_JSON OUT [--generation-prompt]
        [--no-thinking]

CONVERSATION_JSON: [{"role": "system"|"user"|"assistant", "content": "..."}...]. OUT gets the
rendered text, byte for byte.
"""
import argparse
import json

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def token_text(value):
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("conversation")
    ap.add_argument("out")
    ap.add_argument("--generation-prompt", action="store_true")
    ap.add_argument("--no-thinking", action="store_true")
    a = ap.parse_args()
    cfg = json.load(open(a.config, encoding="utf-8"))
    messages = json.load(open(a.conversation, encoding="utf-8"))
    # transformers' _compile_jinja_template: these options, tojson without ASCII escapes.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    template = env.from_string(cfg["chat_template"])
    extra = {"enable_thinking": False} if a.no_thinking else {}
    text = template.render(messages=messages, add_generation_prompt=a.generation_prompt,
                           bos_token=token_text(cfg.get("bos_token")),
                           eos_token=token_text(cfg.get("eos_token")), **extra)
    with open(a.out, "w", encoding="utf-8", newline="") as f:
        f.write(text)


if __name__ == "__main__":
    main()
