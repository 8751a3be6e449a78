"""Quick start: one synchronous response and one stream.

Run it against a running server: `python docs/examples/quickstart.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults).
"""

import os

from openai import OpenAI

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = OpenAI(base_url=base_url, api_key="sk-no-auth")

resp = client.responses.create(model=model, input="Reply with: hello", max_output_tokens=64)
print(resp.output_text)

with client.responses.stream(model=model, input="Write a haiku.", max_output_tokens=64) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
    print()
    print(stream.get_final_response().usage)
