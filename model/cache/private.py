"""The prompt cache's disk tier on the file system: its folders and the modes of its files.

Each file holds a prompt's token ids in the clear (and a KV state that gives the prompt
away as well), so the tier is the server's user's alone: folders 0700 and files 0600,
set explicitly rather than left to the process umask, which is 022 on most systems.
At start the modes an earlier release left (0755 folders, 0644 files) are closed too.

`DIR` (`--prompt-cache-dir`) holds one folder per model, named by its 16-hex-digit key
(`prompt_disk.Identity.key`). `DIR` itself is made 0700 too, unless it is not this
user's or is shared (the sticky bit, as `/tmp` has): a folder others use is not the
tier's to close, and its model folders are what keep the files from them.

Imports nothing of MLX or NumPy: the command line calls `close_tree` at start, before
the fast BLAS is loaded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
"""Every file of the tier, the temporary ones from their creation."""
FOLDER_MODE = 0o700
"""Every folder of the tier."""
KEY_DIGITS = 16
"""The length of a model folder's name: hex digits of its identity's hash."""


def close_folder(folder: Path) -> None:
    """Make `folder` (its missing parents as `mkdir -p` does) 0700 whatever the umask;
    an existing one too, unless it is another user's or shared (sticky). OSError when
    it cannot be made, or is not a folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(FOLDER_MODE)  # never wider than 0700, even before the chmod
    found = folder.stat()
    if not stat.S_ISDIR(found.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    if found.st_uid == os.getuid() and not found.st_mode & stat.S_ISVTX:
        os.chmod(folder, FOLDER_MODE)


def close_model_folder(folder: Path) -> None:
    """`folder`, one model's (made if missing), 0700 and every file in it 0600."""
    close_folder(folder)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            # Removed meanwhile (the budget), or another user's: the folder keeps it safe.
            with contextlib.suppress(OSError):
                os.chmod(path, FILE_MODE)


def close_tree(root: Path) -> None:
    """`root` and every model folder in it (loaded this time or not) closed; what else
    `root` holds is not the tier's and keeps its modes."""
    close_folder(root)
    for path in root.iterdir():
        name = path.name
        is_key = len(name) == KEY_DIGITS and all(c in "0123456789abcdef" for c in name)
        if is_key and path.is_dir() and not path.is_symlink():
            close_model_folder(path)


def create_private(path: Path) -> int:
    """A descriptor of `path`, created for writing (it must not exist: `O_EXCL`) with
    mode 0600 from its creation, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a umask may have narrowed it (0600 is what we read)
    except BaseException:
        os.close(fd)
        raise
    return fd
