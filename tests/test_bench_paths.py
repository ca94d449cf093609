"""Every bench script imports this tree's phantora: the repository goes on sys.path before phantora is imported,
or the venv's editable install (/work/main for every clone) answers the import and a clone measures another tree."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = {"phantora", "bridge"}


def _imports_ours(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in OURS for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS and node.level == 0


def _puts_repo_first(node: ast.stmt, src: str) -> bool:
    text = ast.get_source_segment(src, node) or ""
    return "sys.path.insert(0," in text and ("parents[1]" in text or text.rstrip().endswith("str(ROOT))"))


def late_repo(path: Path) -> str | None:
    """Why `path` may import phantora before the repository is on its path (None: it may not)."""
    src = path.read_text()
    tree = ast.parse(src)
    if not any(_imports_ours(n) for n in ast.walk(tree)):
        return None
    for node in tree.body:
        if _puts_repo_first(node, src):
            return None
        if _imports_ours(node):
            return f"{path.name}:{node.lineno}: imports {ast.unparse(node)[:60]!r} before the repository is on sys.path"
    return f"{path.name}: imports phantora in a function, and never puts the repository on sys.path"


def test_the_check_finds_a_late_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nfrom phantora import x\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))\n")
    assert "bad.py:2" in str(late_repo(bad))
    bad.write_text("def f():\n    import phantora\n")
    assert "never puts" in str(late_repo(bad))
    good = tmp_path / "good.py"
    good.write_text("import sys\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))\nimport phantora\n")
    assert late_repo(good) is None


def test_every_bench_script_puts_the_repository_first() -> None:
    late = [why for p in sorted((ROOT / "bench").glob("*.py")) if (why := late_repo(p))]
    assert not late, "\n".join(late)
