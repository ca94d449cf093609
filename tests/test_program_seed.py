"""`phantora run --program-seed`: an unseeded program's generators seeded per rank, so a live run repeats
(phantora/runtime/program_seed.py, docs/runtime.md "Reproducibility"). Real ranks and real torch: the references
are the generators themselves seeded outside phantora, and the interpreter's own str hash under PYTHONHASHSEED."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phantora.cli import main
from phantora.errors import InputError
from phantora.launcher import RunConfig, launch, rank_options
from phantora.runtime.program_seed import stream_seed

PROGRAM = Path(__file__).resolve().parent / "scripts" / "program_seed_draws.py"
TORCH_DEFAULT_SEED = 67280421310721  # PyTorch's default seed of a CUDA generator (torch.cuda.initial_seed())


def run(
    out: Path, *args: str, seed: int | str = 0, env: dict[str, str] | None = None
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Each rank's draws and results.json of a 2-rank run of the program."""
    cfg = RunConfig(str(PROGRAM), list(args), topology="testbed16", nproc=2, out_dir=out, program_seed=seed)
    cfg.env = dict(env or {})
    rep = launch(cfg)
    draws = {}
    for r in range(2):
        line = next(ln for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("{"))
        draws[r] = json.loads(line)
    return draws, rep.summary


def torch_draws(seed: int) -> list[int]:
    """The program's torch.randint draws from a CPU generator seeded with `seed`."""
    return torch.randint(0, 2**62, (3,), generator=torch.Generator().manual_seed(seed)).tolist()


def interpreter_hash(text: str, hash_seed: str) -> int:
    """`hash(text)` in a fresh interpreter started with PYTHONHASHSEED=hash_seed."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", f"print(hash({text!r}))"], env=env, capture_output=True, text=True)
    return int(out.stdout)


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, dict[int, dict[str, Any]], dict[str, Any]]]:
    """The unseeded program run twice with the default program seed."""
    runs = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp("seed") / name
        draws, summary = run(out)
        runs.append((out, draws, summary))
    return runs


def test_an_unseeded_program_runs_alike_twice(twice: list[Any]) -> None:
    """Same draws, same ops, same flows: steps.jsonl and flows.csv byte for byte; the program seed is recorded."""
    (a, draws_a, sum_a), (b, draws_b, sum_b) = twice
    assert draws_a == draws_b
    for name in ("steps.jsonl", "flows.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "steps.jsonl").read_text().count("\n") == 2 and sum_a["end_ns"] == sum_b["end_ns"]
    assert sum_a["run"]["program_seed"] == sum_b["run"]["program_seed"] == 0
    assert json.loads((a / "config.json").read_text())["options"]["program_seed"] == 0


def test_each_rank_has_its_own_streams_from_the_program_seed(twice: list[Any]) -> None:
    """Rank r's torch CPU, random and numpy generators start at the seed of stream "rank r"; the CUDA generators keep
    PyTorch's default seed; str hashes are those of PYTHONHASHSEED = the program seed (unless the environment sets
    it)."""
    _, draws, _ = twice[0]
    assert draws[0]["torch"] != draws[1]["torch"] and draws[0]["random"] != draws[1]["random"]
    for r in range(2):
        value = stream_seed(0, f"rank {r}")
        assert (
            draws[r]["torch"] == torch.randint(0, 2**62, (3,), generator=torch.Generator().manual_seed(value)).tolist()
        )
        want = random.Random(value)
        assert draws[r]["random"] == [want.random() for _ in range(3)]
        assert draws[r]["numpy"] == np.random.RandomState(value & (2**32 - 1)).randint(0, 2**31, 3).tolist()
        assert draws[r]["cuda_initial_seed"] == TORCH_DEFAULT_SEED
        assert draws[r]["hash"] == interpreter_hash("phantora", os.environ.get("PYTHONHASHSEED", "0"))


def test_a_program_that_seeds_itself_gets_exactly_its_own_streams(tmp_path: Path) -> None:
    """torch.manual_seed, random.seed and np.random.seed in the program replace the run's seeds: every rank draws
    what those generators seeded with 1234 draw outside phantora."""
    draws, _ = run(tmp_path / "own", "--seed", "1234")
    ref = random.Random(1234)
    want = {
        "torch": torch_draws(1234),
        "random": [ref.random() for _ in range(3)],
        "numpy": np.random.RandomState(1234).randint(0, 2**31, 3).tolist(),
    }
    for r in range(2):
        assert {k: draws[r][k] for k in want} == want


def test_program_seed_random_leaves_the_generators_to_the_interpreter(tmp_path: Path, twice: list[Any]) -> None:
    """`random`: recorded, and the draws are no stream's of the default seed. The run's own PYTHONHASHSEED is kept
    (given here as the seeded runs', so the ranks fork from the same warm zygote); `random` sets none of its own."""
    draws, summary = run(tmp_path / "random", seed="random", env={"PYTHONHASHSEED": "0"})
    assert summary["run"]["program_seed"] == "random"
    seeded = twice[0][1]
    assert all(draws[r]["torch"] != seeded[r]["torch"] and draws[r]["random"] != seeded[r]["random"] for r in range(2))
    assert draws[0]["hash"] == interpreter_hash("phantora", "0")
    opts = rank_options(RunConfig("x.py", program_seed="random"), "h100", tmp_path, ("calibrated", (), None), False)
    assert opts.to_env()["PHANTORA_PROGRAM_SEED"] == "random" and "PYTHONHASHSEED" not in opts.to_env()
    given = RunConfig("x.py", program_seed=7, env={"PYTHONHASHSEED": "3"})
    assert rank_options(given, "h100", tmp_path, ("calibrated", (), None), False).hash_seed is None  # the run's wins
    opts = rank_options(RunConfig("x.py", program_seed=7), "h100", tmp_path, ("calibrated", (), None), False)
    assert opts.hash_seed == ("7" if "PYTHONHASHSEED" not in os.environ else None)


@pytest.mark.parametrize("value", ["-1", "4294967296", "abc", "1.5"])
def test_a_bad_program_seed_is_one_line_naming_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--topology", "testbed16", f"--program-seed={value}", str(PROGRAM)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--program-seed" in err and repr(value) in err, err
    with pytest.raises(InputError, match="--program-seed"):
        launch(RunConfig(str(PROGRAM), topology="testbed16", nproc=2, program_seed=value))


def test_ranks_forked_by_the_program_inherit_its_torch_generator_and_get_their_own_random(tmp_path: Path) -> None:
    """--spawn, fork method: the launching process's torch generator starts at the stream "launching process" and
    each forked rank continues it (as under torch: fork copies it); `random`, which Python reseeds at random in a forked
    child, starts at the stream "rank R"."""
    script = PROGRAM.parent / "program_seed_spawn.py"
    rep = launch(RunConfig(str(script), ["fork"], topology="testbed16", nproc=2, spawn=True, out_dir=tmp_path / "f"))
    gen = torch.Generator().manual_seed(stream_seed(0, "launching process"))
    launcher = torch.randint(0, 2**62, (1,), generator=gen).tolist()
    inherited = torch.randint(0, 2**62, (2,), generator=gen).tolist()
    for r in range(2):
        line = next(ln for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("{"))
        draws = json.loads(line)
        assert draws["torch"] == inherited
        assert draws["random"] == random.Random(stream_seed(0, f"rank {r}")).random()
    spawner = (tmp_path / "f" / "logs" / "spawner.log").read_text()
    assert json.loads(next(ln for ln in spawner.splitlines() if ln.startswith("{")))["launcher"] == launcher
