"""Compile mlxcel's native code for this machine: one CPU probe, one table of instruction
sets, one compiler finder and one way to compile, for everything native.

Two shared libraries come out, and they must stay two:

- the BLAS shim (``blas_shim.c``, ``blas_skinny.c``, ``pool.c``) is loaded with
  ``RTLD_GLOBAL`` before ``mlx.core`` is first imported, so that MLX's ``cblas_sgemm`` binds
  to it (``blas.py``); it links OpenBLAS and nothing of MLX or Python, because it must be in
  place before either is loaded;
- the kernels' extension (``kernels.cpp``, the primitives ``qmm_ext.cpp``, ``attn_ext.cpp``
  and ``layer_ext.cpp`` over ``qmm_kernel.c``, ``attn_kernel.c``, ``layer_kernel.c``,
  ``pool.c``) is a Python module of MLX primitives linked to ``libmlx`` through nanobind, so
  it can load only once MLX has.

Both come out of :func:`compile_library`, with the same instruction set's flags, into
``cache_dir()/native``, each under a name hashing everything that shapes it (sources,
headers, flags, compilers, the libraries it links and their versions): an edited kernel,
another instruction set or an upgraded environment gets a fresh file, never a stale one.
At run time they share one thread pool (``pool.c``: the extension's copy forwards to the
shim's). A third recipe, the quantized matmul alone as a plain library, is for the kernel's
tests and ``bench/qmm.py`` (called through ctypes, ``qmm_lib.py``).

:func:`probe` reads the CPU once from ``/proc/cpuinfo``; the widest build it runs is chosen:
``avx512`` (F, BW, VL and DQ with FMA, BMI2 and F16C; plus VBMI's byte permutes where the CPU
has them, as Intel's from Ice Lake and AMD's from Zen 4 do; on Intel CPUs with AMX the
quantized matmul's tile path, which it asks Linux for at run time; AMD's AVX-512 with VNNI
and BF16 but no AMX runs the same build without it), else ``avx2`` (with FMA, BMI2 and
F16C), else ``generic`` (plain C). The shim's kernel is built for every CPU; the kernels
only where they are vectorised (``generic`` only when forced, for tests), otherwise models
keep MLX's own operations.

Environment:

``MLXCEL_CPU_ISA`` (older names ``MLXCEL_QMM_ISA`` and ``MLXCEL_BLAS_ISA``; the first set wins)
    ``avx512``, ``avx2`` or ``generic`` forces that build of both libraries; ``off`` keeps
    MLX's own operations instead of the kernels (the shim keeps the CPU's build). A build
    the CPU cannot run, or an unknown name, is refused with a warning, and the CPU's own
    build is used.
``CC``, ``CXX``
    The C and C++ compilers (default: the first of ``cc``, ``gcc``, ``clang``, and the C++
    driver beside it).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mlxcel.config import cache_dir

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
ISA_VARIABLES = ("MLXCEL_CPU_ISA", "MLXCEL_QMM_ISA", "MLXCEL_BLAS_ISA")
"""The variables that force a build, the first set one winning."""
KERNELS_MODULE = "mlxcel_kernels"
"""The extension's module name (``NB_MODULE`` in ``kernels.cpp``)."""


class NativeBuildError(RuntimeError):
    """Native code could not be built; its users fall back (see ``blas.py``, ``kernels.py``)."""


@dataclass(frozen=True)
class Isa:
    """One build: the CPU flags it needs (as /proc/cpuinfo spells them), the compiler's."""

    needs: frozenset[str]
    flags: tuple[str, ...]


ISAS: dict[str, Isa] = {
    "avx512": Isa(
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "bmi2", "f16c"}),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mbmi2", "-mf16c"),
    ),
    "avx2": Isa(
        frozenset({"avx2", "fma", "bmi2", "f16c"}), ("-mavx2", "-mfma", "-mbmi2", "-mf16c")
    ),
    "generic": Isa(frozenset(), ()),
}
"""Every build, widest first; ``simd.h`` names them by the same words."""
VBMI_FLAG = "-mavx512vbmi"
"""Added to ``avx512`` on a CPU with VBMI (the quantized matmul's unpacking, its AMX path)."""


@dataclass(frozen=True)
class Cpu:
    """What the probe read: the first processor's vendor, model name and feature flags.

    ``known`` is False when the flags could not be read on an x86 machine: then a forced
    build is trusted rather than refused."""

    vendor: str
    model: str
    flags: frozenset[str]
    known: bool = True

    def runs(self, isa: str) -> bool:
        return ISAS[isa].needs <= self.flags

    @property
    def isa(self) -> str:
        """The widest build this CPU runs."""
        return next(name for name in ISAS if self.runs(name))

    @property
    def vbmi(self) -> bool:
        return "avx512vbmi" in self.flags

    @property
    def amx(self) -> bool:
        """The tile unit the quantized matmul's AVX-512 build with VBMI uses when it can."""
        return {"amx_tile", "amx_bf16"} <= self.flags and self.vbmi

    def describe(self) -> str:
        extras = [name for name, has in (("VBMI", self.vbmi), ("AMX", self.amx)) if has]
        tier = self.isa + (f" with {' and '.join(extras)}" if extras else "")
        return f"{self.model or self.vendor or platform.machine()} ({tier})"


def probe(cpuinfo: str | None = None) -> Cpu:
    """This CPU, or the one the text of a ``/proc/cpuinfo`` describes."""
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return Cpu("", platform.machine(), frozenset())
        cpuinfo = _read_cpuinfo()
        if cpuinfo is None:
            return Cpu("", "", frozenset(), known=False)
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep and fields:
            break  # the first processor's block is read
        fields.setdefault(key.strip(), value.strip())
    flags = frozenset(fields.get("flags", "").split())
    return Cpu(fields.get("vendor_id", ""), fields.get("model name", ""), flags)


@functools.cache
def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


_warned: set[str] = set()


def forced_isa() -> str | None:
    """The build the environment asks for (``off`` included), or None. An unknown name is
    refused, with a warning once."""
    for variable in ISA_VARIABLES:
        value = os.environ.get(variable, "").strip().lower()
        if not value:
            continue
        if value in ("off", "none"):
            return "off"
        if value in ISAS:
            return value
        _warn_once(f"{variable}={value!r} is not one of {', '.join(ISAS)} or off; ignored")
        return None
    return None


def chosen_isa(cpu: Cpu | None = None) -> str:
    """The build for this CPU: the forced one when the CPU runs it, else its widest."""
    cpu = probe() if cpu is None else cpu
    forced = forced_isa()
    if forced is not None and forced in ISAS:
        if cpu.runs(forced) or not cpu.known:
            return forced
        _warn_once(f"the {forced} build was asked for, but this CPU runs {cpu.isa} at most")
    return cpu.isa


def kernels_isa(cpu: Cpu | None = None) -> str | None:
    """The kernels' build, or None for none (``off``, or a CPU that only gets the generic
    build without asking: there MLX's own operations stay)."""
    forced = forced_isa()
    if forced == "off":
        return None
    isa = chosen_isa(cpu)
    return None if isa == "generic" and forced != "generic" else isa


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def compile_flags(isa: str, cpu: Cpu | None = None) -> tuple[str, ...]:
    """The compiler's flags for ``isa`` on this CPU (``avx512`` gains VBMI where it has it)."""
    cpu = probe() if cpu is None else cpu
    return ISAS[isa].flags + ((VBMI_FLAG,) if isa == "avx512" and cpu.vbmi else ())


@dataclass(frozen=True)
class Compilers:
    cc: str
    cxx: str


def compilers() -> Compilers:
    """``$CC``, else the first of cc, gcc, clang on ``PATH``; ``$CXX``, else its C++ driver."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and (found := shutil.which(name)):
            return Compilers(found, os.environ.get("CXX") or _cxx_beside(found))
    raise NativeBuildError("no C compiler (cc, gcc or clang) to build the native code")


def _cxx_beside(cc: str) -> str:
    """The C++ driver beside the C compiler ``cc`` (gcc -> g++, clang -> clang++)."""
    path = Path(cc)
    for c_name, cxx_name in (("gcc", "g++"), ("clang", "clang++"), ("cc", "c++")):
        if path.name.startswith(c_name):
            candidate = path.with_name(path.name.replace(c_name, cxx_name, 1))
            if candidate.exists():
                return str(candidate)
    return "c++"


@dataclass(frozen=True)
class Recipe:
    """One shared library: C sources compiled for the instruction set, C++ sources (the
    binding) compiled with the link, and what else shapes the binary (library paths,
    versions) for its name's hash. Sources are named relative to this folder."""

    name: str
    c_sources: tuple[str, ...]
    c_flags: tuple[str, ...]
    cxx_sources: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    link: tuple[str, ...] = ()
    shapes: tuple[str, ...] = ()


_C_FLAGS = ("-O3", "-fPIC", "-pthread")


def _digest(recipe: Recipe, flags: tuple[str, ...], tools: Compilers) -> str:
    h = hashlib.sha256()
    headers = sorted(p.name for p in HERE.glob("*.h"))
    for name in (*recipe.c_sources, *recipe.cxx_sources, *headers):
        path = Path(name) if os.path.isabs(name) else HERE / name
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    parts = (*recipe.c_flags, *flags, *recipe.cxx_flags, *recipe.link, *recipe.shapes)
    for part in (*parts, tools.cc, tools.cxx if recipe.cxx_sources else ""):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def compile_library(recipe: Recipe, isa: str, out_dir: Path, cpu: Cpu | None = None) -> Path:
    """``recipe`` built for ``isa`` into ``out_dir``, once (the same inputs give the same
    name, so a later call or another process finds it there).

    Objects and the library are written in a private temporary folder and the library is
    renamed into place, so processes starting together never load a half-written file."""
    if isa not in ISAS:
        raise NativeBuildError(f"unknown instruction set {isa!r}")
    tools = compilers()
    flags = compile_flags(isa, cpu)
    target = out_dir / f"{recipe.name}-{isa}-{_digest(recipe, flags, tools)}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmp:
        objects = []
        for source in recipe.c_sources:
            obj = Path(tmp) / f"{Path(source).stem}.o"
            command = [tools.cc, *recipe.c_flags, *flags, "-c", str(HERE / source), "-o", str(obj)]
            run_compiler(command, what=f"{recipe.name} ({isa}): {source}")
            objects.append(str(obj))
        out = Path(tmp) / target.name
        driver = tools.cxx if recipe.cxx_sources else tools.cc
        sources = [s if os.path.isabs(s) else str(HERE / s) for s in recipe.cxx_sources]
        command = [driver, *recipe.cxx_flags, "-shared", *sources, *objects, *recipe.link]
        run_compiler([*command, "-o", str(out)], what=f"{recipe.name} ({isa})", timeout=600)
        os.replace(out, target)
    log.info("Built %s", target)
    return target


def run_compiler(cmd: list[str], *, what: str, timeout: float = 300) -> None:
    """Run one compiler command; a failure raises with the compiler's first lines of error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise NativeBuildError(f"{what} did not compile: {proc.stderr.strip()[:800]}")


def native_dir() -> Path:
    """Where the shim and the extension are kept: ``native`` in the user cache."""
    return cache_dir() / "native"


def shim_recipe(openblas: Path) -> Recipe:
    """The BLAS shim over ``openblas`` (a library whose symbols carry ``scipy_``); its copy
    of the pool is the process's (``MLXCEL_POOL_OWNER``)."""
    lib = openblas.resolve()
    return Recipe(
        "mlxcel-blas-shim",
        ("blas_shim.c", "blas_skinny.c", "pool.c"),
        (*_C_FLAGS, "-fvisibility=hidden", "-DMLXCEL_POOL_OWNER"),
        link=("-pthread", str(lib), f"-Wl,-rpath,{lib.parent}"),
    )


def build_shim(openblas: Path, isa: str | None = None, out_dir: Path | None = None) -> Path:
    """The BLAS shim for ``openblas`` and this CPU (``chosen_isa`` unless ``isa``). A
    compiler that cannot target the CPU's own set (not one asked for) gets ``generic``."""
    chosen = isa or chosen_isa()
    out = native_dir() if out_dir is None else out_dir
    try:
        return compile_library(shim_recipe(openblas), chosen, out)
    except NativeBuildError as exc:
        if chosen == "generic" or isa is not None or forced_isa() in ISAS:
            raise
        log.warning("%s; building the generic BLAS shim", exc)
        return compile_library(shim_recipe(openblas), "generic", out)


def kernels_recipe() -> Recipe:
    """The kernels' extension, against the headers and library the installed ``mlx`` wheel
    ships and nanobind's sources (MLX's own binding library: an array passed from Python
    reaches a primitive as MLX's C++ type only when both share nanobind's ABI, hence the
    closed version range in ``pyproject.toml``)."""
    spec = importlib.util.find_spec("nanobind")
    if spec is None or spec.origin is None:
        raise NativeBuildError("the nanobind package is not installed")
    nb = Path(spec.origin).parent
    import mlx.core

    mlx_root = Path(mlx.core.__file__).parent  # the wheel's root: include/, lib/
    versions = tuple(f"{dist}={_version(dist)}" for dist in ("mlx", "nanobind"))
    return Recipe(
        "mlxcel-kernels",
        ("qmm_kernel.c", "attn_kernel.c", "layer_kernel.c", "pool.c"),
        (*_C_FLAGS, "-std=c11", "-fvisibility=hidden"),
        ("kernels.cpp", "qmm_ext.cpp", "attn_ext.cpp", "layer_ext.cpp", str(nb / "src" / "nb_combined.cpp")),
        ("-O2", "-std=c++20", "-fPIC", "-pthread", "-fvisibility=hidden", "-DNB_DOMAIN=mlx",
         "-DNDEBUG", f"-I{sysconfig.get_paths()['include']}", f"-I{nb / 'include'}",
         f"-I{nb / 'ext' / 'robin_map' / 'include'}", f"-I{mlx_root / 'include'}", f"-I{HERE}"),
        (f"-L{mlx_root / 'lib'}", "-lmlx", f"-Wl,-rpath,{mlx_root / 'lib'}"),
        (*versions, str(sysconfig.get_config_var("EXT_SUFFIX"))),
    )  # fmt: skip


def build_kernels(isa: str, out_dir: Path | None = None) -> Path:
    """The kernels' extension for ``isa``, built once per machine."""
    return compile_library(kernels_recipe(), isa, native_dir() if out_dir is None else out_dir)


def build_qmm_library(isa: str, out_dir: Path, defines: dict[str, int] | None = None) -> Path:
    """The quantized matmul alone as a plain library (its functions exported, warnings as
    errors) for ``isa`` with the kernel's compile-time knobs: for its tests and benchmark."""
    knobs = tuple(f"-D{key}={value}" for key, value in sorted((defines or {}).items()))
    tag = "".join(f"-{key}{value}" for key, value in sorted((defines or {}).items()))
    recipe = Recipe(
        f"mlxcel-qmm{tag}",
        ("qmm_kernel.c", "pool.c"),
        (*_C_FLAGS, "-std=c11", "-Wall", "-Wextra", "-Werror", *knobs),
        link=("-pthread",),
    )
    return compile_library(recipe, isa, out_dir)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"
