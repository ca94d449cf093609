"""How many ranks a `--spawn` program starts, read from its source before it runs (`phantora run --spawn` without
`--nproc`).

The run's world is fixed before any process starts (the coordinator's and the topology's), so the count is read
from the program's own `torch.multiprocessing.spawn(fn, args, nprocs)` / `start_processes(...)` calls: each
`nprocs` an integer literal, or a name the module binds once, to one; absent, torch's default of 1. A call whose
count is anything else (`torch.cuda.device_count()`, an argument) leaves the default, the GPUs of one host, which is
what such a program asks for when it counts the GPUs; a count that still differs ends the run at the call in one line
naming both (runtime/spawned.py).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

MODULE = "torch.multiprocessing"
CALLS = ("spawn", "start_processes")  # torch.multiprocessing's; nprocs is the third parameter of both
NPROCS_AT = 2


def declared_nprocs(script: str | Path) -> tuple[int, str] | None:
    """(nprocs, "file:line" of the first call) if every torch.multiprocessing spawn / start_processes call of
    `script` names the same count that can be read without running it; else None (also for an unreadable file)."""
    path = Path(script)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    modules, functions = _aliases(tree)
    constants = _constants(tree)
    counts: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_spawn(node.func, modules, functions):
            count = _count(node, constants)
            if count is None:
                return None
            counts.append((count, node.lineno))
    if not counts or len({c for c, _ in counts}) != 1:
        return None
    first = min(line for _, line in counts)
    return counts[0][0], f"{path.name}:{first}"


def _aliases(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """The dotted names that stand for torch.multiprocessing, and the names bound to its spawn functions."""
    modules, functions = {MODULE}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == MODULE and a.asname:
                    modules.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                if node.module == "torch" and a.name == "multiprocessing":
                    modules.add(a.asname or a.name)
                elif node.module == MODULE and a.name in CALLS:
                    functions[a.asname or a.name] = a.name
    return modules, functions


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _is_spawn(func: ast.expr, modules: set[str], functions: dict[str, str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in functions
    return isinstance(func, ast.Attribute) and func.attr in CALLS and _dotted(func.value) in modules


def _int(node: ast.expr | None) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _constants(tree: ast.Module) -> dict[str, int]:
    """Names the file binds exactly once (anywhere: assignments, loops, parameters), to an integer literal."""
    literal: dict[str, int] = {}
    binds: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            binds[node.id] += 1
        elif isinstance(node, ast.arg):
            binds[node.arg] += 1
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        value = _int(node.value) if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and value is not None:
            literal[target.id] = value
    return {name: value for name, value in literal.items() if binds[name] == 1}


def _count(call: ast.Call, constants: dict[str, int]) -> int | None:
    """A call's nprocs: its keyword or third argument, torch's 1 if neither; None if it cannot be read."""
    given = next((k.value for k in call.keywords if k.arg == "nprocs"), None)
    if given is None and len(call.args) > NPROCS_AT:
        given = call.args[NPROCS_AT]
    if given is None:
        unpacked = any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)
        return None if unpacked else 1
    if isinstance(given, ast.Name):
        return constants.get(given.id)
    return _int(given)
