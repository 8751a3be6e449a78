"""The prompt cache's disk-tier flags, and where its files go.

`--prompt-cache-dir` defaults to a folder in the user cache folder when the store is
SQLite (a server that keeps its responses across restarts keeps its prompt caches too)
and to none with a memory or Redis store. A folder named on the command line that cannot
be written stops the server at start; the default one only turns the disk tier off, with
a warning: the server serves as well without it. The folder and the tier's files are
the server's user's alone (0700, 0600: `model/cache/private.py`), made so at start
whatever an earlier release left.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from mlxcel.cli.flag_table import Flag
from mlxcel.config import Settings, cache_dir
from mlxcel.errors import ConfigError
from mlxcel.model.cache.private import close_tree, create_private
from mlxcel.store.limits import sqlite_path

log = logging.getLogger(__name__)

FOLDER = "prompt-cache"
"""The default folder's name in the user cache folder."""

_DEFAULTS = Settings()

PROMPT_CACHE_FLAGS: tuple[Flag, ...] = (
    Flag(
        ("--prompt-cache-dir",),
        "prompt_cache_dir",
        Path,
        None,
        "MLXCEL_PROMPT_CACHE_DIR",
        "folder where cached prompt prefixes' KV states are written when evicted from memory "
        "and at shutdown, and read back on a later hit, after a restart too (default: "
        f"`{FOLDER}` in the user cache folder with --store sqlite; none with memory or redis)",
    ),
    Flag(
        ("--prompt-cache-disk-bytes",),
        "prompt_cache_disk_bytes",
        int,
        _DEFAULTS.prompt_cache_disk_bytes,
        "MLXCEL_PROMPT_CACHE_DISK_BYTES",
        "bytes of prompt-cache files kept in that folder (least recently used removed "
        "first); 0 turns the disk tier off",
    ),
)


def resolve_prompt_cache_dir(settings: Settings) -> Settings:
    """`settings` with `prompt_cache_dir` the folder to use, created and writable, or
    None for no disk tier. ConfigError when a folder given cannot be written."""
    given = settings.prompt_cache_dir
    off = settings.prompt_cache_disk_bytes == 0 or settings.prompt_cache_bytes == 0
    if off or (given is None and sqlite_path(settings.store) is None):
        return replace(settings, prompt_cache_dir=None)
    folder = cache_dir() / FOLDER if given is None else given.expanduser().absolute()
    problem = unwritable(folder)
    if problem is None:
        return replace(settings, prompt_cache_dir=folder)
    if given is not None:
        raise ConfigError(f"--prompt-cache-dir {given}: {problem}")
    log.warning("prompt cache: %s: %s; prompt caches stay in memory only", folder, problem)
    return replace(settings, prompt_cache_dir=None)


def unwritable(folder: Path) -> str | None:
    """Why files cannot be written in `folder` (created if missing, and closed with the
    tier's files in it), or None."""
    probe = folder / f".probe-{os.getpid()}"
    try:
        close_tree(folder)
        probe.unlink(missing_ok=True)  # a crashed server's of the same pid
        os.close(create_private(probe))
        probe.unlink()
    except OSError as exc:
        return f"cannot write there ({exc.strerror or exc})"
    return None
