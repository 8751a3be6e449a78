"""Background mode: submit, poll until the status is terminal, and cancel.

Run it against a running server: `python docs/examples/background.py`
(MLXCEL_BASE_URL and MLXCEL_MODEL override the defaults).
"""

import os
import time

from openai import OpenAI

base_url = os.environ.get("MLXCEL_BASE_URL", "http://127.0.0.1:8080/v1")
model = os.environ.get("MLXCEL_MODEL", "qwen2.5-coder-0.5b-instruct")
client = OpenAI(base_url=base_url, api_key="sk-no-auth")

job = client.responses.create(
    model=model, input="Write a haiku about rain.", background=True, max_output_tokens=64
)
print(job.id, job.status)  # queued (or already in_progress)

while job.status in ("queued", "in_progress"):
    time.sleep(0.5)
    job = client.responses.retrieve(job.id)
print(job.status, job.output_text)

# Only the cancel endpoint stops a job; a cancelled job stays cancelled.
doomed = client.responses.create(
    model=model, input="Count to one thousand.", background=True, max_output_tokens=2000
)
print(client.responses.cancel(doomed.id).status)
