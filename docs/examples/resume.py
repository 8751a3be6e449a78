"""Resuming a background response's stream after a dropped connection.

Run it against a running server: `python docs/examples/resume.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults).
"""

import os

from openai import OpenAI

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = OpenAI(base_url=base_url, api_key="sk-no-auth")

job = client.responses.create(
    model=model, input="Write a haiku about rain.", background=True, max_output_tokens=64
)

# Read the events (GET /v1/responses/{id}?stream=true) and drop the connection early.
last = -1
with client.responses.retrieve(job.id, stream=True) as stream:
    for event in stream:
        last = event.sequence_number
        if last == 3:
            break
print("read up to event", last)

# Resume after the last event seen: the next one first, then the rest until the end.
with client.responses.retrieve(job.id, stream=True, starting_after=last) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
        elif event.type in ("response.completed", "response.incomplete", "response.failed"):
            print(f"\n[{event.sequence_number}] {event.response.status}")
