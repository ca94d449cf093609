"""TorchScript under the simulated GPU: `torch.tensor` & co, which phantora wraps (simcuda/device.py), stay the aten
ops TorchScript calls for them.

`import torch.distributed.optim` scripts its functional optimizers (`@torch.jit.script` classes that call
`torch.tensor`); with `torch.tensor` a Python wrapper, TorchScript tried to compile it and stopped reading its source
("module, class, method, function, traceback, frame, or code object was expected, got builtin_function_or_method"):
pytorch/examples' distributed/rpc/ddp_rpc stopped at its import. Checked in a fresh interpreter, as a rank has it (the
wrappers are global to the process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import torch
from phantora.runtime.simcuda import device
device._patch_host_entry_points()
assert torch.tensor is not torch._C._VariableFunctions.tensor  # wrapped
import torch.distributed.optim  # scripts _FunctionalAdadelta & co

@torch.jit.script
def f(n: int) -> torch.Tensor:
    return torch.tensor([n, 2 * n]) + torch.as_tensor([1, 1])

print(f(3).tolist(), "aten::tensor" in str(f.graph))
"""


def test_scripted_code_calls_the_wrapped_factories_as_aten_ops(tmp_path: Path) -> None:
    program = tmp_path / "scripted.py"  # a file: TorchScript reads the function's source
    program.write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, str(program)]
    proc = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[4,", "7]", "True"]
