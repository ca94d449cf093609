"""Build hook: copy the repository's shipped folders into the package as `phantora/_data/`.

topologies/, workloads/, examples/ and the ns-3 model sources (ns3-scratch/: Makefile, model/, runner/,
test/) stay where they are in the repository; a wheel (`pip install .`, `pip wheel .`) carries copies of them, which
`phantora.resources` finds. An editable install copies nothing: it uses the repository's folders.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Shipped folder -> the parts of it that are shipped (the same lists as phantora/resources.py).
SHIPPED = {
    "topologies": ("",),
    "workloads": ("",),
    "examples": ("",),
    "ns3-scratch": ("Makefile", "model", "runner", "test"),
}


def shipped_files() -> list[Path]:
    """The shipped files, relative to the repository root."""
    out: list[Path] = []
    for folder, parts in SHIPPED.items():
        for part in parts:
            src = ROOT / folder / part
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            rels = [p.relative_to(ROOT) for p in files]
            out += [r for r in rels if "__pycache__" not in r.parts and "build" not in r.parts]
    return out


class BuildPyWithData(build_py):
    """`build_py`, then the shipped folders into <build>/phantora/_data/ (not in editable mode)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for rel in shipped_files():
            dst = Path(self.build_lib) / "phantora" / "_data" / rel
            self.mkpath(str(dst.parent))
            self.copy_file(str(ROOT / rel), str(dst), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return [*outputs, *(str(Path(self.build_lib) / "phantora" / "_data" / rel) for rel in shipped_files())]


# The simulated GPU's per-op fast path in C (phantora/runtime/simcuda/_fastop.c); optional: without a C compiler the
# install goes on and phantora runs the Python it transcribes (simcuda/compiled.py warns once).
FASTOP = Extension(
    "phantora.runtime.simcuda._fastop",
    ["phantora/runtime/simcuda/_fastop.c"],
    extra_compile_args=["-O2"],
    optional=True,
)

setup(cmdclass={"build_py": BuildPyWithData}, ext_modules=[FASTOP])
