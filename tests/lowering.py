"""Every Triton kernel the CPU suite launches, lowered to Triton IR for Hopper (sm_90).

Triton's interpreter (TRITON_INTERPRET=1, the CPU suite) runs a kernel as Python: it never
meets the code generator's checks, such as the types two branches of a `constexpr` if return.
A kernel that passes every CPU test can then fail to compile on the GPU, and a gpu_docs run
is lost. `record()` notes each launch's argument types and constexpr values; `lower_all()`
runs the code generator on each distinct launch (no driver, no GPU: AST to TTIR only; with
full=True through ptxas to a cubin) and returns what failed, with the kernel's file and line.

The interpreter patches triton.language for a launch and does not undo all of it (a device
function's patches stay), so the pristine attributes are saved at import, before any launch,
and put back while lowering.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass

import triton.language as tl

# triton.language objects the interpreter patches (triton/runtime/interpreter.py, _patch_lang)
_PATCHED = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)
_PRISTINE = {id(obj): dict(vars(obj)) for obj in _PATCHED}
_SKIP = {"num_warps", "num_stages", "num_ctas", "maxnreg", "grid", "warmup"}
_OPTIONS = ("num_warps", "num_stages")


@dataclass(frozen=True)
class Launch:
    kernel: object  # the InterpretedFunction
    signature: tuple[tuple[str, str], ...]  # (parameter, Triton type or "constexpr")
    constexprs: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, int], ...] = ()  # num_warps, num_stages as launched
    attrs: tuple[tuple[int, str], ...] = ()  # (parameter index, "D"): divisible by 16, as the
    # JIT specialises a pointer or an integer; the code generator then vectorises and aligns

    def where(self, error: Exception | None = None) -> str:
        """file:line (kernel): the line the code generator stopped at, else the def line."""
        fn = self.kernel.fn
        lines, start = inspect.getsourcelines(fn)
        line = start + next(i for i, text in enumerate(lines) if text.lstrip().startswith("def "))
        at = re.match(r"at (\d+):\d+:", str(error or ""))
        line += int(at[1]) - 1 if at else 0
        return f"{inspect.getsourcefile(fn)}:{line} ({fn.__name__})"


LAUNCHES: dict[tuple, Launch] = {}


_BACKEND = {}


def _backend(arch: int = 90):
    """Triton's CUDA backend for sm_<arch> (no driver needed): the JIT's specialisation rules."""
    if arch not in _BACKEND:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import CUDABackend

        _BACKEND[arch] = CUDABackend(GPUTarget("cuda", arch, 32))
    return _BACKEND[arch]


def _launch_of(fn, args, kwargs) -> Launch | None:
    """The launch as the JIT would specialise it on the GPU (triton.runtime.jit's
    native_specialize_impl): types, integers equal to 1 as constexprs, and which pointers and
    integers are divisible by 16 -- unless the kernel says do_not_specialize(_on_alignment)."""
    from triton.runtime.jit import native_specialize_impl

    options_of = getattr(fn, "kwargs", {})
    fixed = set(options_of.get("do_not_specialize") or ())
    unaligned = fixed | set(options_of.get("do_not_specialize_on_alignment") or ())
    params = inspect.signature(fn.fn).parameters
    bound = inspect.signature(fn.fn).bind_partial(
        *args, **{k: v for k, v in kwargs.items() if k not in _SKIP}
    )
    bound.apply_defaults()
    signature, constexprs, attrs = [], [], []
    for index, (name, param) in enumerate(params.items()):
        if name not in bound.arguments:
            return None  # a launch this module does not understand: not recorded
        value = bound.arguments[name]
        if "constexpr" in str(param.annotation) or value is None:
            signature.append((name, "constexpr"))
            constexprs.append((name, value))
            continue
        kind, key = native_specialize_impl(_backend(), value, False, name not in fixed,
                                           name not in unaligned)  # fmt: skip
        if kind == "constexpr":  # an integer 1
            signature.append((name, "constexpr"))
            constexprs.append((name, key))
            continue
        signature.append((name, kind))
        if isinstance(key, str) and key:
            attrs.append((index, key))
    try:
        hash(tuple(constexprs))
    except TypeError:
        return None
    options = tuple((k, kwargs[k]) for k in _OPTIONS if kwargs.get(k) is not None)
    return Launch(fn, tuple(signature), tuple(constexprs), options, tuple(attrs))


def record() -> None:
    """Note every interpreted launch from now on (the root conftest calls this on the CPU)."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run
    if getattr(run, "_records", False):
        return

    def recording_run(self, *args, grid, warmup, **kwargs):
        try:
            launch = _launch_of(self, args, kwargs)
        except Exception:  # an argument mangle_type cannot name: not recorded, still launched
            launch = None
        if launch is not None:
            key = (id(self), launch.signature, launch.constexprs, launch.options, launch.attrs)
            LAUNCHES.setdefault(key, launch)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    recording_run._records = True
    InterpretedFunction.run = recording_run


def _restore(saved: dict[int, dict]) -> list[tuple[object, str, object]]:
    """Put the saved attributes back; returns what to undo afterwards."""
    undo = []
    for obj in _PATCHED:
        now, want = vars(obj), saved[id(obj)]
        for name in set(now) | set(want):
            if now.get(name, _PATCHED) is not want.get(name, _PATCHED):
                undo.append((obj, name, now.get(name, _PATCHED)))
                if name in want:
                    setattr(obj, name, want[name])
                else:
                    delattr(obj, name)
    return undo


def _undo(undo) -> None:
    for obj, name, value in reversed(undo):
        if value is _PATCHED:
            delattr(obj, name)
        else:
            setattr(obj, name, value)


SHARED_LIMIT = {90: 232_448}  # bytes of shared memory a block may opt in to (227 KiB on sm_90)


def lower_all(launches=None, arch: int = 90, full: bool = False, ptx: dict | None = None
              ) -> list[str]:  # fmt: skip
    """Lower each launch to TTIR for sm_<arch>; one line per failure (kernel file:line, the
    launch's constexprs, the code generator's message). full: compile all the way to a cubin
    with the launch's num_warps and num_stages (Triton ships ptxas: no GPU needed; several
    times as long), and fail a launch whose shared memory exceeds what a block may have; each
    launch's PTX goes into `ptx` when given (keyed by the Launch)."""
    import triton
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches = list(LAUNCHES.values() if launches is None else launches)
    target = GPUTarget("cuda", arch, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({})
    jits: dict[int, JITFunction] = {}

    def jit(f):  # with the kernel's own options (do_not_specialize)
        return jits.setdefault(id(f), JITFunction(f.fn, **getattr(f, "kwargs", {})))

    undo = _restore(_PRISTINE)
    swapped = []  # device functions (ours, and triton.language's own: tl.sum is one) as JIT
    owners = [
        m
        for n, m in list(sys.modules.items())
        if m is not None and n.startswith(("snippets", "tests", "triton.language"))
    ]
    for owner in [*owners, tl.core.tensor]:  # tensor: methods such as x.sum() are jit functions
        for attr, value in list(vars(owner).items()):
            if isinstance(value, InterpretedFunction):
                swapped.append((vars(owner), attr, value))
                setattr(owner, attr, jit(value))
    # and wherever a kernel's module lives (a script run as __main__, a probe): the globals of
    # each kernel and of each device function it reaches
    work, seen = [launch.kernel for launch in launches], set()
    while work:
        names = work.pop().fn.__globals__
        if id(names) in seen:
            continue
        seen.add(id(names))
        for attr, value in list(names.items()):
            if isinstance(value, InterpretedFunction):
                swapped.append((names, attr, value))
                names[attr] = jit(value)
                work.append(value)
    failures = []
    try:
        for launch in launches:
            attrs = {(i,): backend.parse_attr(key) for i, key in launch.attrs}
            src = ASTSource(fn=jit(launch.kernel), signature=dict(launch.signature),
                            constexprs=dict(launch.constexprs), attrs=attrs)  # fmt: skip
            context = ir.context()
            ir.load_dialects(context)
            backend.load_dialects(context)
            try:
                if full:
                    compiled = triton.compile(src, target=target, options=dict(launch.options))
                    if compiled.metadata.shared > SHARED_LIMIT[arch]:
                        raise RuntimeError(
                            f"needs {compiled.metadata.shared} bytes of shared "
                            f"memory, sm_{arch} has {SHARED_LIMIT[arch]} a block"
                        )
                    if ptx is not None:
                        ptx[launch] = compiled.asm["ptx"]
                else:
                    src.make_ir(target, options, backend.get_codegen_implementation(options),
                                backend.get_module_map(), context)  # fmt: skip
            except Exception as e:  # every failure is reported, none is raised
                consts = ", ".join(f"{k}={v!r}" for k, v in launch.constexprs)
                cause = e
                while cause.__cause__ is not None:  # the innermost: the code generator's words
                    cause = cause.__cause__
                message = " ".join(str(cause).split()[-40:])
                failures.append(f"{launch.where(e)} [{consts}]: {message}")
    finally:
        for names, attr, value in reversed(swapped):
            if isinstance(names, dict):
                names[attr] = value
            else:  # a class's mappingproxy
                setattr(tl.core.tensor, attr, value)
        _undo(undo)
    return failures


def resources(ptx: str, arch: int = 90) -> dict[str, int]:
    """Registers a thread and bytes of spill stores of a PTX kernel, as ptxas -v reports them
    (Triton's bundled ptxas, sm_<arch>a): what limits the threads in flight."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        out = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}a", str(src), "-o",
                              str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True,
                             check=True).stderr  # fmt: skip
    registers = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    if registers is None or spills is None:
        raise RuntimeError(f"ptxas -v said nothing about registers: {out[-500:]}")
    return {"registers": int(registers[1]), "spill_stores": int(spills[1])}


def enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def main(argv: list[str]) -> int:
    """TRITON_INTERPRET=1 python -m tests.lowering [--full] script.py ...: run each script (a
    probe, a GPU-only benchmark's CPU dry run) under the recorder, then lower what it launched
    (--full: compile each to a cubin for sm_90 and check its shared memory)."""
    import runpy

    full = "--full" in argv
    argv = [a for a in argv if a != "--full"]
    if not enabled() or not argv:
        print("usage: TRITON_INTERPRET=1 python -m tests.lowering [--full] script.py [...]")
        return 2
    record()
    for path in argv:
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                print(f"{path}: exited with {e.code}")
                return 1
    failures = lower_all(full=full)
    done = "compiled to cubins" if full else "lowered"
    print(f"{len(LAUNCHES)} launches {done} for sm_90, {len(failures)} failed")
    print("\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
