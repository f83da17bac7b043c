#!/usr/bin/env python3
"""Reference chat-template ids and assistant masks from Hugging Face transformers'
apply_chat_template (Jinja, as models ship their templates), in the project's .venv.

The templates below write the published formats of Llama 3, ChatML (Qwen) and Gemma 3
with {% generation %} blocks around what an assistant says, so transformers itself marks
the tokens that count (return_assistant_tokens_mask, from the fast tokenizer's offsets).
transformers renders with trim_blocks: a line end right after a block tag is written as
an expression, as the models' own templates do.

Usage: hf_chat.py llama3|chatml|gemma tokenizer.json [EXPORTED.jinja] < conversations.json
(a JSON array of OpenAI-style message lists, or of {"messages", "tools"} objects: tool
use, which chatml writes as Qwen 2.5 and 3 do). Prints a JSON object: "ids" and "masks",
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
    # Qwen 2.5's tool use (Hermes' format) without its default system message.
    "chatml": (
        CONTENT + "{% if tools %}<|im_start|>system\n"
        "{% if messages[0]['role'] == 'system' %}{{ text(messages[0]['content']) }}{{ '\\n\\n' }}{% endif %}"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>{{ '\\n' }}{% endif %}"
        "{% for m in messages %}"
        "{% if loop.first and m['role'] == 'system' and tools %}"
        "{% elif m['role'] == 'tool' %}"
        "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
        "{{ '\\n' }}<tool_response>{{ '\\n' }}{{ text(m['content']) }}{{ '\\n' }}</tool_response>"
        "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
        "{% elif m['role'] == 'assistant' and m['tool_calls'] %}<|im_start|>assistant{{ '\\n' }}{% generation %}"
        "{% set said = text(m['content']) if m['content'] else '' %}{{ said }}"
        "{% for call in m['tool_calls'] %}{% set f = call['function'] if call['function'] is defined else call %}"
        "{% if not loop.first or said %}{{ '\\n' }}{% endif %}<tool_call>{{ '\\n' }}"
        "{\"name\": \"{{ f['name'] }}\", \"arguments\": "
        "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}{% endif %}"
        "}{{ '\\n' }}</tool_call>{% endfor %}<|im_end|>{% endgeneration %}{{ '\\n' }}"
        "{% else %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ text(m['content']) }}<|im_end|>{% endgeneration %}"
        "{% else %}{{ text(m['content']) }}<|im_end|>{% endif %}{{ '\\n' }}"
        "{% endif %}{% endfor %}"),
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
tools = [c.get("tools") if isinstance(c, dict) else None for c in conversations]
conversations = [c["messages"] if isinstance(c, dict) else c for c in conversations]
for messages, functions in zip(conversations, tools):
    r = tokenizer.apply_chat_template(messages, tools=functions, chat_template=TEMPLATES[sys.argv[1]], tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
    out["ids"].append(r["input_ids"])
    out["masks"].append(r["assistant_masks"])
if len(sys.argv) == 4:
    # A template as tide exports it (no generation blocks): its ids, and the prompt a chat
    # engine writes for the last turn (the conversation before it, then the assistant's
    # header).
    with open(sys.argv[3]) as f:
        exported = f.read()
    out["exported_ids"] = [tokenizer.apply_chat_template(m, tools=f, chat_template=exported, tokenize=True)
                           for m, f in zip(conversations, tools)]
    out["prompt_ids"] = [tokenizer.apply_chat_template(m[:-1], tools=f, chat_template=exported, tokenize=True,
                                                       add_generation_prompt=True)
                         for m, f in zip(conversations, tools)]
print(json.dumps(out))
