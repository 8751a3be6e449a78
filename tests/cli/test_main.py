"""Flags, environment variables and their precedence; `--help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlxcel.cli.flag_table import FLAGS
from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.cli.main import main, server_main
from mlxcel.cli.webhook_flags import WEBHOOK_FLAGS
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.store.limits import redis_url, sqlite_path


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    environ = env or {}
    return settings_from_args(build_parser("t", environ).parse_args(argv))


def test_defaults_match_the_spec() -> None:
    s = settings([])
    assert (s.host, s.port, s.parallel, s.max_queue_depth) == ("127.0.0.1", 8080, 4, 32)
    assert (s.responses.max_entries, s.responses.max_bytes, s.responses.ttl_secs) == (
        1024,
        268435456,
        3600,
    )
    assert (s.conversations.max_entries, s.conversations.max_bytes) == (256, 67108864)
    assert s.conversations.ttl_secs == 3600
    assert s.background_max_jobs == 64
    assert s.background_ephemeral_ttl_secs == 600
    assert s.reasoning_echo_max_bytes == 16 * 1024 * 1024
    assert s.model is None


def test_every_default_is_the_settings_own() -> None:
    assert settings([]) == Settings()
    assert settings([], {"MLXCEL_LOG_LEVEL": "debug"}) == Settings()


def test_flags_and_short_aliases() -> None:
    s = settings(
        [
            "-m",
            "/m",
            "-a",
            "local",
            "--port",
            "9",
            "-c",
            "2048",
            "--parallel",
            "8",
            "--max-queue-depth",
            "3",
            "--max-jobs",
            "7",
            "--responses-store-ttl-secs",
            "0",
        ]
    )
    assert s.model == Path("/m")
    assert (s.alias, s.port, s.ctx_size, s.parallel, s.max_queue_depth) == ("local", 9, 2048, 8, 3)
    assert s.background_max_jobs == 7
    assert s.responses.ttl_secs == 0


def test_environment_variables_and_flags_win() -> None:
    env = {
        "LLAMA_ARG_RESPONSES_STORE_MAX_ENTRIES": "5",
        "MLXCEL_RESPONSES_STORE_MAX_BYTES": "1000",
        "LLAMA_ARG_RESPONSES_STORE_TTL_SECS": "7",
        "MLXCEL_RESPONSES_BACKGROUND_MAX_JOBS": "3",
        "MLXCEL_RESPONSES_BACKGROUND_EPHEMERAL_TTL_SECS": "9",
        "LLAMA_ARG_CONVERSATION_STORE_MAX_ENTRIES": "0",
        "MLXCEL_CONVERSATION_STORE_MAX_BYTES": "0",
        "LLAMA_ARG_CONVERSATION_STORE_TTL_SECS": "11",
        "LLAMA_ARG_PORT": "1234",
        "MLXCEL_REASONING_ECHO_MAX_BYTES": "0",
    }
    s = settings([], env)
    assert (s.responses.max_entries, s.responses.max_bytes, s.responses.ttl_secs) == (5, 1000, 7)
    assert (s.background_max_jobs, s.background_ephemeral_ttl_secs) == (3, 9)
    assert (s.conversations.max_entries, s.conversations.max_bytes) == (0, 0)
    assert s.conversations.ttl_secs == 11
    assert s.port == 1234
    assert s.reasoning_echo_max_bytes == 0
    assert not s.conversations.enabled
    assert settings(["--port", "99", "--max-jobs", "1"], env).port == 99
    assert settings(["--responses-background-max-jobs", "1"], env).background_max_jobs == 1


def test_tool_call_parser_from_flag_or_environment() -> None:
    assert settings([]).tool_call_parser is None  # picked from the chat template
    env = {"MLXCEL_TOOL_CALL_PARSER": "mistral"}
    assert settings([], env).tool_call_parser == "mistral"
    assert settings(["--tool-call-parser", "pythonic"], env).tool_call_parser == "pythonic"


def test_prompt_cache_bytes_from_flag_or_environment() -> None:
    assert settings([]).prompt_cache_bytes == 2 * 1024**3
    env = {"MLXCEL_PROMPT_CACHE_BYTES": "1000"}
    assert settings([], env).prompt_cache_bytes == 1000
    assert settings(["--prompt-cache-bytes", "0"], env).prompt_cache_bytes == 0  # disabled


def test_reasoning_echo_budget_from_flag_or_environment() -> None:
    env = {"MLXCEL_REASONING_ECHO_MAX_BYTES": "1000"}
    assert settings([], env).reasoning_echo_max_bytes == 1000
    assert settings(["--reasoning-echo-max-bytes", "0"], env).reasoning_echo_max_bytes == 0
    with pytest.raises(ConfigError, match="MLXCEL_REASONING_ECHO_MAX_BYTES"):
        settings([], {"MLXCEL_REASONING_ECHO_MAX_BYTES": "lots"})


def test_hosted_tools_and_images_from_flag_or_environment() -> None:
    assert (Settings().hosted_tools, Settings().images) == ("reject", "placeholder")
    assert settings(["--hosted-tools", "ignore"]).hosted_tools == "ignore"
    assert settings([], {"MLXCEL_HOSTED_TOOLS": "ignore"}).hosted_tools == "ignore"
    assert settings(["--images", "reject"]).images == "reject"
    env = {"MLXCEL_IMAGES": "reject", "MLXCEL_HOSTED_TOOLS": "ignore"}
    assert settings(["--images", "placeholder", "--hosted-tools", "reject"], env) == Settings()


def test_store_from_flag_or_environment(tmp_path: Path) -> None:
    assert Settings().store == "memory"
    assert settings(["--store", f"sqlite:{tmp_path}/s.db"]).store == f"sqlite:{tmp_path}/s.db"
    assert settings([], {"MLXCEL_STORE": "sqlite"}).store == "sqlite"
    assert settings(["--store", "memory"], {"MLXCEL_STORE": "sqlite"}) == Settings()
    assert sqlite_path("sqlite:~/s.db") == Path.home() / "s.db"
    default = sqlite_path("sqlite")
    assert default is not None
    assert default.name == "store.sqlite3"
    assert default.parent.name == "mlxcel"


def test_redis_store_prefix_and_lease_from_flag_or_environment() -> None:
    url = "redis://127.0.0.1:6390/2"
    chosen = settings(["--store", url, "--redis-key-prefix", "team", "--replica-lease-secs", "4"])
    assert (chosen.store, chosen.redis_key_prefix, chosen.replica_lease_secs) == (url, "team", 4)
    env = {"MLXCEL_STORE": "rediss://:pw@cache:6380/0", "MLXCEL_REDIS_KEY_PREFIX": "x"}
    assert settings([], env).store == "rediss://:pw@cache:6380/0"
    assert settings([], env).redis_key_prefix == "x"
    assert (Settings().redis_key_prefix, Settings().replica_lease_secs) == ("mlxcel", 15.0)
    assert redis_url(url) == url
    assert redis_url("sqlite") is None
    assert sqlite_path(url) is None


def test_progress_events_are_on_unless_turned_off() -> None:
    assert settings([]).progress_events is True
    assert settings(["--no-progress-events"]).progress_events is False
    assert settings([], {"MLXCEL_NO_PROGRESS_EVENTS": "1"}).progress_events is False
    assert settings([], {"MLXCEL_NO_PROGRESS_EVENTS": "false"}).progress_events is True
    with pytest.raises(ConfigError, match="MLXCEL_NO_PROGRESS_EVENTS"):
        build_parser("t", {"MLXCEL_NO_PROGRESS_EVENTS": "maybe"})


def test_an_unknown_tool_call_parser_stops_start_up() -> None:
    # Checked where the parser is picked, before the model is resolved or loaded.
    assert settings(["--tool-call-parser", "xml"]).tool_call_parser == "xml"
    exe = Path(sys.executable).with_name("mlxcel-server")
    result = subprocess.run(
        [str(exe), "--tool-call-parser", "xml", "--model", "/nonexistent"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "error: --tool-call-parser must be one of hermes, mistral" in result.stderr


def test_zero_disables_background_mode() -> None:
    assert settings([]).background_enabled
    for flag in ("--max-jobs", "--responses-store-max-entries", "--responses-store-max-bytes"):
        assert not settings([flag, "0"]).background_enabled


@pytest.mark.parametrize(
    "argv",
    [
        ["--responses-background-ephemeral-ttl-secs", "0"],
        ["--parallel", "0"],
        ["--responses-store-max-entries", "-1"],
        ["--port", "70000"],
        ["--prompt-cache-bytes", "-1"],
        ["--responses-store-ttl-secs", "-1"],
        ["--conversation-store-ttl-secs", "nan"],
        ["--reasoning-echo-max-bytes", "-1"],
        ["--hosted-tools", "allow"],
        ["--images", "describe"],
        ["--store", "redis://"],
        ["--store", "rediss://:secret@/0"],
        ["--replica-lease-secs", "0"],
        ["--redis-key-prefix", "a{b}"],
        ["--store", "sqlite3:/tmp/x"],
        ["--store", "memory:/tmp/x"],
        ["--store", ""],
        ["--store", "sqlite::memory:"],
        ["--store", "sqlite:file:x?mode=memory"],
        ["--store", "rediss://:pw@host:abc/0"],
        ["--store", "redis://host:99999"],
        ["--store", "redis://[::1"],
        ["--store", "redis://host/db"],
        ["--cors-origins", "https://app.example/path"],
        ["--cors-origins", "app.example"],
    ],
)
def test_invalid_values_fail_start_up_with_a_clear_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError):
        settings(argv)
    assert server_main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert err.count("\n") == 1  # one line, never a traceback
    assert "pw" not in err
    assert argv[0].lstrip("-").split("-")[0] in err


def test_bad_environment_value_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="LLAMA_ARG_PORT"):
        build_parser("t", {"LLAMA_ARG_PORT": "eighty"})


def test_help_lists_every_flag_with_its_environment_variable() -> None:
    for prog in (["mlxcel-server"], ["mlxcel", "serve"]):
        exe = Path(sys.executable).with_name(prog[0])
        out = subprocess.run(
            [str(exe), *prog[1:], "--help"], capture_output=True, text=True, check=True
        ).stdout
        for flag in (*FLAGS, *WEBHOOK_FLAGS):
            assert flag.names[-1] in out
            if flag.env:
                assert flag.env in out


def test_mlxcel_without_a_known_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main([]) == 2


def test_metrics_public_from_flag_or_environment() -> None:
    assert settings([]).metrics_public is False
    assert settings(["--metrics-public"]).metrics_public is True
    assert settings([], {"MLXCEL_METRICS_PUBLIC": "1"}).metrics_public is True
    assert settings([], {"MLXCEL_METRICS_PUBLIC": "false"}).metrics_public is False
    with pytest.raises(ConfigError, match="MLXCEL_METRICS_PUBLIC"):
        settings([], {"MLXCEL_METRICS_PUBLIC": "maybe"})


def test_rate_limits_from_flags_or_environment() -> None:
    off = settings([])
    assert (off.rate_limit_rpm, off.rate_limit_tpm, off.daily_token_quota) == (0, 0, 0)
    given = settings(["--rate-limit-rpm", "60", "--rate-limit-tpm", "9000"])
    assert (given.rate_limit_rpm, given.rate_limit_tpm) == (60, 9000)
    env = {"MLXCEL_RATE_LIMIT_RPM": "5", "MLXCEL_DAILY_TOKEN_QUOTA": "100000"}
    from_env = settings([], env)
    assert (from_env.rate_limit_rpm, from_env.daily_token_quota) == (5, 100_000)
    assert settings(["--rate-limit-rpm", "7"], env).rate_limit_rpm == 7  # the flag wins
    with pytest.raises(ConfigError, match="--rate-limit-tpm"):
        settings(["--rate-limit-tpm", "-1"])
    with pytest.raises(ConfigError, match="MLXCEL_DAILY_TOKEN_QUOTA"):
        settings([], {"MLXCEL_DAILY_TOKEN_QUOTA": "lots"})


def test_admin_flags_from_flags_or_environment() -> None:
    assert (settings([]).admin_keys, settings([]).admin_rate_limit_rpm) == ((), 6)
    given = settings(["--admin-key", "sk-a, sk-b", "--admin-rate-limit-rpm", "2"])
    assert (given.admin_keys, given.admin_rate_limit_rpm) == (("sk-a", "sk-b"), 2)
    env = {"MLXCEL_ADMIN_KEY": "sk-env", "MLXCEL_ADMIN_RATE_LIMIT_RPM": "0"}
    from_env = settings([], env)
    assert (from_env.admin_keys, from_env.admin_rate_limit_rpm) == (("sk-env",), 0)
    assert settings(["--admin-key", "sk-c"], env).admin_keys == ("sk-env", "sk-c")
    with pytest.raises(ConfigError, match="--admin-rate-limit-rpm"):
        settings(["--admin-rate-limit-rpm", "-1"])


def test_the_access_log_is_on_unless_turned_off() -> None:
    assert settings([]).access_log is True
    assert settings(["--no-access-log"]).access_log is False
    assert settings([], {"MLXCEL_ACCESS_LOG": "0"}).access_log is False
    assert settings(["--access-log"], {"MLXCEL_ACCESS_LOG": "0"}).access_log is True


def test_cors_origins_from_flag_or_environment() -> None:
    assert settings([]).cors_origins == ()
    both = settings(["--cors-origins", "https://app.example, http://localhost:5173"])
    assert both.cors_origins == ("https://app.example", "http://localhost:5173")
    assert settings([], {"MLXCEL_CORS_ORIGINS": "*"}).cors_origins == ("*",)


def test_model_aliases_from_flags_or_environment() -> None:
    assert settings([]).model_aliases == ()
    given = settings(["--model-alias", "claude-*=qwen", "--model-alias", "gpt-4o = qwen, o3=q"])
    assert given.model_aliases == (("claude-*", "qwen"), ("gpt-4o", "qwen"), ("o3", "q"))
    env = {"MLXCEL_MODEL_ALIAS": "claude-*=from-env"}
    assert settings([], env).model_aliases == (("claude-*", "from-env"),)
    both = settings(["--model-alias", "x=y"], env).model_aliases
    assert both == (("claude-*", "from-env"), ("x", "y"))  # combined, the variable's first
    for bad in ("claude-*", "=qwen", "claude-*="):
        with pytest.raises(ConfigError, match="--model-alias"):
            settings(["--model-alias", bad])
