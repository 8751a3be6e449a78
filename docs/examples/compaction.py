"""Compaction, both ways: `/v1/responses/compact` and automatic `context_management`.

Run it against a running server: `python docs/examples/compaction.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults).
"""

import base64
import json
import os

from openai import OpenAI

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = OpenAI(base_url=base_url, api_key="sk-no-auth")

# A session that has grown long.
history = [{"role": "developer", "content": "You are a terse coding assistant."}]
for topic in ("the parser", "the tests", "the docs"):
    history.append({"role": "user", "content": f"Let us talk about {topic}. " * 8})
    history.append({"role": "assistant", "content": f"Noted: {topic} needs work. " * 8})
history.append({"role": "user", "content": "What should I do first?"})

# 1. Explicitly: compact the history, then continue from the compacted output.
compacted = client.responses.compact(
    model=model,
    input=history,
    extra_body={"max_output_tokens": 128},  # an mlxcel extension
)
print([item.type for item in compacted.output])  # kept messages, ..., "compaction"
content = compacted.output[-1].encrypted_content  # base64url JSON, not encrypted
summary = json.loads(base64.urlsafe_b64decode(content + "=" * (-len(content) % 4)))["summary"]
print("summary:", summary[:80])

next_input = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
next_input.append({"role": "user", "content": "And after that?"})
before = client.responses.input_tokens.count(model=model, input=history).input_tokens
after = client.responses.input_tokens.count(model=model, input=next_input).input_tokens
print(f"prompt: {before} tokens before compaction, {after} after")
reply = client.responses.create(model=model, input=next_input, max_output_tokens=32)
print(reply.output_text)

# 2. Automatically: the server compacts when the rendered input reaches the threshold;
# the response's output then starts with the compaction item.
managed = [{"type": "compaction", "compact_threshold": before // 2}]
first = client.responses.create(
    model=model, input=history, max_output_tokens=32, extra_body={"context_management": managed}
)
print([item.type for item in first.output])  # ["compaction", "message"]

# Chained turns replay the summary, and do not compact again below the threshold.
second = client.responses.create(
    model=model,
    input="Thanks.",
    previous_response_id=first.id,
    max_output_tokens=32,
    extra_body={"context_management": managed},
)
print([item.type for item in second.output])  # ["message"]
