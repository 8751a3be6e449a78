"""Anthropic's Messages API with the `anthropic` SDK: a message, its stream, a count.

Run it against a running server: `python docs/examples/anthropic_messages.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults). The `anthropic` client takes
the server's address without `/v1`.
"""

import os

from anthropic import Anthropic

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1").removesuffix("/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = Anthropic(base_url=base_url, api_key="sk-no-auth")

question = {"role": "user", "content": "What is the weather in Paris?"}
message = client.messages.create(
    model=model, max_tokens=64, system="Answer briefly.", messages=[question]
)
print(message.stop_reason, message.content[0].text)  # end_turn ...

with client.messages.stream(model=model, max_tokens=64, messages=[question]) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()

# The prompt's tokens, rendered as the first message's were (its usage adds up to them).
count = client.messages.count_tokens(model=model, system="Answer briefly.", messages=[question])
print(count.input_tokens, "tokens")
