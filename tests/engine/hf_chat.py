#!/usr/bin/env python3
"""Reference chat-template ids and assistant masks from Hugging Face transformers'
apply_chat_template (Jinja, as models ship their templates), in the project's .venv.

The templates below write the published formats of Llama 3, ChatML (Qwen) and Gemma 3
with {% generation %} blocks around what an assistant says, so transformers itself marks
the tokens that count (return_assistant_tokens_mask, from the fast tokenizer's offsets).
transformers renders with trim_blocks: a line end right after a block tag is written as
an expression, as the models' own templates do.

Usage: hf_chat.py llama3|chatml|gemma tokenizer.json [EXPORTED.jinja] < conversations.json
(a JSON array of OpenAI-style message lists). Prints a JSON object: "ids" and "masks",
one list per conversation; with the template tide exports, "exported_ids" and
"prompt_ids" by it too.
"""
import json
import sys

from transformers import PreTrainedTokenizerFast

# A message's content: a string, or OpenAI's list of parts whose texts are joined.
CONTENT = ("{% macro text(content) %}{% if content is string %}{{ content }}{% else %}"
           "{% for part in content %}{{ part['text'] }}{% endfor %}{% endif %}{% endmacro %}")

TEMPLATES = {
    "llama3": (
        CONTENT + "<|begin_of_text|>"
        "{% for m in messages %}"
        "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ text(m['content']) | trim }}<|eot_id|>{% endgeneration %}"
        "{% else %}{{ text(m['content']) | trim }}<|eot_id|>{% endif %}"
        "{% endfor %}"),
    "chatml": (
        CONTENT + "{% for m in messages %}"
        "<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ text(m['content']) }}<|im_end|>{% endgeneration %}"
        "{% else %}{{ text(m['content']) }}<|im_end|>{% endif %}{{ '\\n' }}"
        "{% endfor %}"),
    "gemma": (
        CONTENT + "<bos>"
        "{% if messages[0]['role'] == 'system' %}"
        "{% set prefix = text(messages[0]['content']) + '\n\n' %}{% set turns = messages[1:] %}"
        "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
        "{% for m in turns %}"
        "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('turns must alternate user, assistant') }}{% endif %}"
        "{% set turn = (prefix if loop.first else '') + (text(m['content']) | trim) %}"
        "{% if m['role'] == 'assistant' %}"
        "<start_of_turn>model\n{% generation %}{{ turn }}<end_of_turn>{% endgeneration %}{{ '\\n' }}"
        "{% else %}<start_of_turn>user\n{{ turn }}<end_of_turn>\n{% endif %}"
        "{% endfor %}"),
}

if len(sys.argv) not in (3, 4) or sys.argv[1] not in TEMPLATES:
    sys.exit(__doc__)
tokenizer = PreTrainedTokenizerFast(tokenizer_file=sys.argv[2])
conversations = json.load(sys.stdin)
out = {"ids": [], "masks": []}
for messages in conversations:
    r = tokenizer.apply_chat_template(messages, chat_template=TEMPLATES[sys.argv[1]], tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
    out["ids"].append(r["input_ids"])
    out["masks"].append(r["assistant_masks"])
if len(sys.argv) == 4:
    # A template as tide exports it (no generation blocks): its ids, and the prompt a chat
    # engine writes for the last turn (the conversation before it, then the assistant's
    # header).
    with open(sys.argv[3]) as f:
        exported = f.read()
    out["exported_ids"] = [tokenizer.apply_chat_template(m, chat_template=exported, tokenize=True)
                           for m in conversations]
    out["prompt_ids"] = [tokenizer.apply_chat_template(m[:-1], chat_template=exported, tokenize=True,
                                                       add_generation_prompt=True) for m in conversations]
print(json.dumps(out))
