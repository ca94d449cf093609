"""The simulated machine's CUDA toolkit, for a program's build-time checks.

Programs look for the toolkit before they train: `torch.utils.cpp_extension.CUDA_HOME`, ``$CUDA_HOME``,
``nvcc --version`` (Megatron-LM's fused-kernel loader runs ``CUDA_HOME + "/bin/nvcc" -V`` and reads the
release), `torch.version.cuda`. A rank answers as a machine with the toolkit of `torch.version.cuda`
would: ``CUDA_HOME`` (and ``CUDA_PATH``) name a small folder in phantora's cache whose ``bin/nvcc``
prints that release, and ``bin`` is first on ``PATH``.

The simulated GPU runs no compiled kernels of a program, so nothing is compiled for it: building a CUDA
extension (`torch.utils.cpp_extension.load` / `load_inline` with CUDA sources) stops with one line naming
the extension, and so does the simulated ``nvcc`` asked to compile anything. C++-only extensions build
as usual.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from phantora import resources
from phantora.runtime import import_hooks
from phantora.runtime.simcuda import extensions
from phantora.runtime.simcuda.devices import NotSimulatedError

_BUILD = "Built on Thu_Mar_28_02:18:24_PDT_2024"
_NVCC = """#!/bin/sh
# nvcc of phantora's simulated CUDA toolkit: it tells its release and compiles nothing
for arg in "$@"; do
  case "$arg" in
    --version|-V)
      echo "nvcc: NVIDIA (R) Cuda compiler driver"
      echo "Copyright (c) 2005-2024 NVIDIA Corporation"
      echo "{build}"
      echo "Cuda compilation tools, release {release}, V{release}.131"
      echo "Build cuda_{release}.r{release}/compiler.34097967_0"
      exit 0;;
  esac
done
echo "phantora: nvcc cannot compile for the simulated GPU (nvcc $*): it runs no compiled kernels of a program;" \\
  "use the program's unfused PyTorch path (a flag such as Megatron-LM's --no-masked-softmax-fusion)" >&2
exit 1
"""


def home(release: str) -> Path:
    """The toolkit folder for CUDA `release` (made once, in phantora's cache): ``bin/nvcc``, ``include``, ``lib64``."""
    root = resources.cache_dir() / f"simcuda-toolkit-{release}"
    nvcc = root / "bin" / "nvcc"
    if not nvcc.exists():
        for sub in ("bin", "include", "lib64"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        tmp = nvcc.with_name(f"nvcc.{os.getpid()}.tmp")
        tmp.write_text(_NVCC.format(build=_BUILD, release=release))
        tmp.chmod(0o755)
        tmp.replace(nvcc)  # atomic: ranks may make it at once
    return root


def install(release: str) -> None:
    """Make this process's toolkit the simulated one of CUDA `release`."""
    root = str(home(release))
    os.environ["CUDA_HOME"] = os.environ["CUDA_PATH"] = root
    os.environ["PATH"] = os.pathsep.join([f"{root}/bin", os.environ.get("PATH", "")])
    import_hooks.after_import("torch.utils.cpp_extension", functools.partial(_patch_cpp_extension, root))


def _patch_cpp_extension(root: str, module: ModuleType) -> None:
    """`CUDA_HOME` names the simulated toolkit; building a CUDA extension stops with one line."""
    module.CUDA_HOME = root  # type: ignore[attr-defined]
    if getattr(module.load, "_phantora", False):
        return
    module.load = _refuse_cuda(module.load, "torch.utils.cpp_extension.load", _load_is_cuda)  # type: ignore[attr-defined]
    module.load_inline = _refuse_cuda(  # type: ignore[attr-defined]
        module.load_inline, "torch.utils.cpp_extension.load_inline", _inline_is_cuda
    )


def _cuda_source(sources: Iterable[Any]) -> bool:
    return any(str(s).endswith((".cu", ".cuh")) for s in sources)


def _load_is_cuda(name: str, sources: Any = (), *args: Any, with_cuda: bool | None = None, **kwargs: Any) -> bool:
    listed = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    return bool(with_cuda) or (with_cuda is None and _cuda_source(listed))


def _inline_is_cuda(
    name: str, cpp_sources: Any = (), cuda_sources: Any = None, *args: Any, with_cuda: bool | None = None, **kw: Any
) -> bool:
    return bool(with_cuda) or (with_cuda is None and bool(cuda_sources))


def _refuse_cuda(build: Callable[..., Any], call: str, is_cuda: Callable[..., bool]) -> Callable[..., Any]:
    @functools.wraps(build)
    def load(*args: Any, **kwargs: Any) -> Any:
        if is_cuda(*args, **kwargs):
            name = args[0] if args else kwargs.get("name", "?")
            module = extensions.provided(name)
            if module is not None:
                print(
                    f"phantora: the CUDA extension '{name}' ({call}) is not compiled: the simulated GPU runs its "
                    "kernels as torch ops, timed by the compute model (simcuda/extensions.py)",
                    file=sys.stderr,
                    flush=True,
                )
                return module
            raise NotSimulatedError(
                f"building the CUDA extension '{name}' ({call}) is not simulated: phantora's GPU runs no compiled "
                "kernels of a program; use the program's unfused PyTorch path instead (a flag such as Megatron-LM's "
                "--no-masked-softmax-fusion), or run it on a real GPU"
            )
        return build(*args, **kwargs)

    load._phantora = True  # type: ignore[attr-defined]
    return load
