"""Chaining turns: `previous_response_id`, a conversation, and token counting.

Run it against a running server: `python docs/examples/chaining.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults).
"""

import os

from openai import OpenAI

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = OpenAI(base_url=base_url, api_key="sk-no-auth")

# Each turn names the previous one; the server restores the whole chain.
first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=32)
second = client.responses.create(
    model=model, input="What is my name?", previous_response_id=first.id, max_output_tokens=32
)
print(second.output_text)

# How long is the next prompt, history included?
count = client.responses.input_tokens.count(
    model=model, input="And where do I live?", previous_response_id=second.id
)
print("next prompt:", count.input_tokens, "tokens")

# The same with a conversation kept by the server.
conversation = client.conversations.create()
client.responses.create(
    model=model, input="Remember 42.", conversation=conversation.id, max_output_tokens=32
)
client.responses.create(
    model=model,
    input="What did I ask you to remember?",
    conversation=conversation.id,
    max_output_tokens=32,
)
for item in client.conversations.items.list(conversation.id, order="asc"):
    print(item.type, getattr(item, "role", ""))

# Stored responses can be read back and deleted.
assert client.responses.retrieve(second.id).id == second.id
client.responses.delete(first.id)
