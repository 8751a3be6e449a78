"""A client's configuration file written the way an editor saves one: the whole new
text to a file beside it, then renamed over it, so a reader (or a crash) never sees
half of it."""

from __future__ import annotations

from pathlib import Path


def replace_text(path: Path, text: str, *, private: bool = False) -> None:
    """Replace `path`'s text atomically (creating its folder); `private`: readable by
    its owner only, as a file that may hold a key should be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".mlxcel-partial")
    partial.write_text(text)
    if private:
        partial.chmod(0o600)
    partial.replace(path)
