"""A simulated NVIDIA apex for ranks on a machine without one (apex builds only against a real CUDA toolkit).

A cluster that trains with Megatron-LM has apex, and programs switch on it: Megatron-core's local layer spec
takes apex's `FusedLayerNorm` when `import apex` succeeds, and only that norm supports `--sequence-parallel`
with `--transformer-impl local`. A rank whose `import apex` finds nothing gets this one instead:

- `apex`, `apex.normalization` and `apex.normalization.fused_layer_norm`: apex's fused LayerNorm and RMSNorm
  (apex_norm.py), each one torch norm kernel timed by the compute model.
- Nothing else. `apex.optimizers`, `apex.multi_tensor_apply`, `amp_C`, `apex.contrib.*` do not import, so a
  program takes the path it takes where apex was built without those extensions (Megatron: torch's AdamW and its
  local multi-tensor helpers, which compute what apex's do, and no persistent LayerNorm).

The finder sits last on `sys.meta_path`: an installed apex is found first and never shadowed. A program that
imports it is told once, in the run's summary and in results.json (`simulated_packages`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
from types import ModuleType

from phantora.runtime.simcuda import apex_norm
from phantora.runtime.simcuda.last_resort import LastResort

_MODULES = {"apex": True, "apex.normalization": True, "apex.normalization.fused_layer_norm": False}  # is a package
_NORMALIZATION = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]
_imported = False


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        global _imported
        _imported = True
        module.__dict__["__phantora_simulated__"] = True
        if module.__name__ == "apex.normalization.fused_layer_norm":
            module.__dict__.update({name: getattr(apex_norm, name) for name in apex_norm.EXPORTS})
        elif module.__name__ == "apex.normalization":
            module.__dict__.update({name: getattr(apex_norm, name) for name in _NORMALIZATION})


_finder = LastResort(_MODULES, _Loader())


def install() -> None:
    """Let `import apex` find the simulated apex when nothing else provides one (after every other finder)."""
    _finder.install()


def simulated_packages() -> list[str] | None:
    """results.json's `simulated_packages`: ["apex"] once the program imported the simulated apex, else None."""
    return ["apex"] if _imported else None
