"""Webhook targets and signatures (`mlxcel.webhooks`): what the flags and the keys file
accept, start errors that never show the secret, signatures the openai SDK verifies, and
the backoff's bounds."""

from __future__ import annotations

import base64
import json
import random
import time

import openai
import pytest

from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.keys import parse_key_file
from mlxcel.webhooks import MAX_BACKOFF_SECS, backoff_secs, event_body, signed_headers

from webhook_receiver import SECRET

KEY = base64.b64decode(SECRET.removeprefix("whsec_"))


def verify(body: bytes, headers: dict[str, str], secret: str = SECRET) -> None:
    with openai.OpenAI(api_key="unused", webhook_secret=secret) as client:
        client.webhooks.verify_signature(body, headers)


def test_a_signed_event_verifies_with_the_sdk_and_says_what_ended() -> None:
    body = event_body("evt_1", "incomplete", "resp_9", 1_700_000_000)
    assert json.loads(body) == {
        "id": "evt_1",
        "object": "event",
        "type": "response.incomplete",
        "created_at": 1_700_000_000,
        "data": {"id": "resp_9"},
    }
    headers = signed_headers(KEY, "evt_1", int(time.time()), body)
    verify(body, headers)
    with openai.OpenAI(api_key="unused", webhook_secret=SECRET) as client:
        event = client.webhooks.unwrap(body, headers)
    assert event.type == "response.incomplete"
    assert event.data.id == "resp_9"


@pytest.mark.parametrize(
    "change",
    [
        lambda b, h: (b.replace(b"resp_9", b"resp_8"), h),
        lambda b, h: (b, {**h, "webhook-id": "evt_2"}),
        lambda b, h: (b, {**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) - 301)}),
        lambda b, h: (b, {**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 301)}),
    ],
    ids=["body", "id", "old", "future"],
)
def test_anything_changed_fails_verification(change: object) -> None:
    body = event_body("evt_1", "completed", "resp_9", 1)
    headers = signed_headers(KEY, "evt_1", int(time.time()), body)
    assert callable(change)
    changed_body, changed_headers = change(body, headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        verify(changed_body, changed_headers)


@pytest.mark.parametrize(
    ("url", "secret", "says"),
    [
        ("http://127.0.0.1:9/hook", "not-a-whsec", "must begin with whsec_"),
        ("http://127.0.0.1:9/hook", "whsec_***not base64***", "is not base64"),
        ("http://127.0.0.1:9/hook", "whsec_" + base64.b64encode(b"short").decode(), "16 bytes"),
        ("ftp://127.0.0.1/hook", SECRET, "absolute http"),
        ("/relative/hook", SECRET, "absolute http"),
        ("http://127.0.0.1:99999/hook", SECRET, "absolute http"),
        ("http://127.0.0.1:9/hook", None, "both its URL and its secret"),
        (None, SECRET, "both its URL and its secret"),
    ],
)
def test_a_wrong_webhook_flag_is_a_clear_start_error(
    url: str | None, secret: str | None, says: str
) -> None:
    argv = [
        *(["--webhook-url", url] if url else []),
        *(["--webhook-secret", secret] if secret else []),
    ]
    with pytest.raises(ConfigError, match=says) as caught:
        settings_from_args(build_parser("t", {}).parse_args(argv))
    assert secret is None or secret.removeprefix("whsec_") not in str(caught.value)


def test_webhook_flags_and_their_environment() -> None:
    env = {"MLXCEL_WEBHOOK_URL": "https://hooks.example/a", "MLXCEL_WEBHOOK_SECRET": SECRET}
    made = settings_from_args(build_parser("t", env).parse_args(["--webhook-max-attempts", "3"]))
    assert made.webhook is not None
    assert made.webhook.url == "https://hooks.example/a"
    assert made.webhook.key == KEY
    assert made.webhook_max_attempts == 3
    assert SECRET not in repr(made)
    assert SECRET.removeprefix("whsec_") not in repr(made.webhook)
    assert Settings().webhook is None
    with pytest.raises(ConfigError, match="--webhook-max-attempts"):
        Settings(webhook_max_attempts=0)
    assert made.webhook_max_pending_per_key == 1_000
    env["MLXCEL_WEBHOOK_MAX_PENDING_PER_KEY"] = "50"
    assert (
        settings_from_args(build_parser("t", env).parse_args([])).webhook_max_pending_per_key == 50
    )
    with pytest.raises(ConfigError, match="--webhook-max-pending-per-key must be at least 1"):
        settings_from_args(build_parser("t", {}).parse_args(["--webhook-max-pending-per-key", "0"]))


def test_a_keys_file_gives_a_key_its_own_webhook() -> None:
    keys = parse_key_file(
        f"carol:sk-carol rpm=5 webhook_url=https://hooks.example/c webhook_secret={SECRET}\n"
        "bob:sk-bob\n",
        "keys",
    )
    assert keys[0].webhook is not None
    assert keys[0].webhook.url == "https://hooks.example/c"
    assert keys[0].limits.rpm == 5
    assert keys[1].webhook is None
    for line, says in [
        ("a:sk-a webhook_url=https://h.example/", "line 1: a webhook needs both"),
        (f"a:sk-a webhook_url=https://h.example/ webhook_secret={SECRET} webhook_url=x", "twice"),
        ("a:sk-a webhook_url=https://h.example/ webhook_secret=whsec_!!", "line 1: .*base64"),
        ("a:sk-a webhook=https://h.example/", "may follow"),
    ]:
        with pytest.raises(ConfigError, match=says) as caught:
            parse_key_file(line, "keys")
        assert "whsec_!!" not in str(caught.value)
        assert "sk-a" not in str(caught.value)


def test_the_backoff_doubles_is_jittered_and_capped() -> None:
    rng = random.Random(7)
    for attempts in (*range(1, 30), 5000):
        ceiling = (
            MAX_BACKOFF_SECS if attempts > 99 else min(MAX_BACKOFF_SECS, 2.0 * 2 ** (attempts - 1))
        )
        waits = [backoff_secs(attempts, 2.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1  # jittered
