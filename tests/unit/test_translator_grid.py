"""The translator grid's page (benchmarks/translators_report.py) is rebuilt from cell folders alone: rows are
named by their checkpoints, macro accuracy weighs cells equally, verdicts pair episodes by id, and a pair
whose checkpoints are missing is refused before any model loads (benchmarks/translators.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _cell(grid: Path, sharer: str, receiver: str, task: str, accs: dict[str, list[int]],
          dtype: str | None = None) -> None:
    folder = grid / f"{sharer}_{receiver}_{task}"
    folder.mkdir(parents=True)
    protocols, records = {}, []
    for row, xs in accs.items():
        if row in ("alone", "t2t", "fullcontext"):
            label, spec = row, {"name": row, "params": {}}
        else:
            ckpt = f"runs/translators/{row}_{sharer}_{receiver}"
            label = f"translated(checkpoint={ckpt!r}, context_aware=False)"
            spec = {"name": "translated", "params": {"checkpoint": ckpt, "context_aware": False}}
        protocols[label] = spec
        records += [{"pair": f"{task}-test-{i:04d}", "protocol": label, "accuracy": x, "em": 0.0, "tteoa": 1.0 + i,
                     "details": {"translator_ms": 5.0, "parameters": 10} if spec["name"] == "translated" else {},
                     "error": None} for i, x in enumerate(xs)]
    config = {"config": {"sharer": sharer, "receiver": receiver, "task": task, "n": len(xs), "protocols": protocols}}
    if dtype:  # as benchmarks/translators.py records it
        config["config"] |= {"dtype": dtype, "device": "cpu"}
        config["environment"] = {"cpu_model": "EPYC", "cpu_bf16": ["avx512_bf16"] if dtype == "bfloat16" else []}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_page_from_cells(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators_report as tr

    _cell(tmp_path, "a", "b", "facts", {"t2t": [0, 0, 0, 0], "xkv": [1, 1, 1, 1], "lcfx": [1, 0, 1, 0]})
    _cell(tmp_path, "a", "b", "reasoning", {"t2t": [1, 1], "xkv": [1, 0], "lcfx": [0, 0]})
    cells = tr.collect(tmp_path)
    assert set(cells[("a:b", "facts")]) == {"t2t", "xkv", "lcfx"}  # rows named by their checkpoint folders
    m, lo, hi, k, n = tr.macro(cells, "xkv")
    assert (m, k, n) == (0.75, 2, 6) and lo <= m <= hi  # (1 + 0.5) / 2: cells weigh equally
    v = tr.paired(cells, "xkv", "lcfx")  # facts: +0.5, reasoning: +0.5; 3 episodes only xkv right, 0 only lcfx
    assert v["diff"] == pytest.approx(0.5) and v["n"] == 6 and v["p"] == pytest.approx(2 / 8)
    text = tr.write_page(tmp_path)
    assert "| xkv | 0.750 [" in text and "] | 0.000 | 2 | 6 |" in text  # macro EM beside accuracy
    assert "XKV > LCF-X | xkv − lcfx | +50.0 pp" in text and "| Holm p |" in text and "Holm–Bonferroni" in text
    assert "not yet:" in text  # the grid's own pairs are listed as pending
    assert (tmp_path / "README.md").exists() and (tmp_path / "accuracy.png").exists()
    assert json.loads((tmp_path / "grid.json").read_text())["pairs"] == ["a:b"]


def test_a_pair_on_some_tasks_only_says_which(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators_report as tr

    _cell(tmp_path, "a", "b", "facts", {"t2t": [0, 1], "xkv": [1, 1]})
    _cell(tmp_path, "a", "b", "reasoning", {"t2t": [1, 1], "xkv": [1, 0]})
    _cell(tmp_path, "c", "b", "facts", {"t2t": [1, 0], "xkv": [0, 0]})
    text = tr.write_page(tmp_path)
    assert "Pairs evaluated: a → b, c → b (facts only)" in text  # a full pair carries no label


def test_each_pair_says_how_it_ran_and_mixed_dtypes_are_flagged(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators_report as tr

    _cell(tmp_path, "a", "b", "facts", {"t2t": [0, 1], "xkv": [1, 1]}, dtype="bfloat16")
    _cell(tmp_path, "c", "b", "facts", {"t2t": [1, 0], "xkv": [0, 0]}, dtype="float32")
    text = tr.write_page(tmp_path)
    assert "Ran in facts: bfloat16 on cpu: EPYC, native bf16 (avx512_bf16)." in text
    assert "Ran in facts: float32 on cpu: EPYC, no native bf16." in text
    assert "Cells ran in different dtypes (bfloat16, float32" in text and "times only within a pair" in text
    assert "per receiver" not in text  # one receiver model: nothing to split
    _cell(tmp_path, "a", "d", "facts", {"t2t": [0, 0], "xkv": [1, 1]}, dtype="float32")
    text = tr.write_page(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| XKV > T2T | +0.0 pp"))
    assert row.split(" | ")[2].startswith("+100.0 pp [") and "n = 2 |" in row  # receiver b nets 0, d alone +100
    _cell(tmp_path / "same", "a", "b", "facts", {"t2t": [0, 1]}, dtype="float32")
    assert "different dtypes" not in tr.write_page(tmp_path / "same")


def test_missing_checkpoint_is_refused_with_the_command(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators

    with pytest.raises(SystemExit, match="train_translators.py --pairs nope-a:nope-b --methods xkv,lcfx"):
        translators.protocols("nope-a", "nope-b", ["xkv", "lcfx"])


def test_evaluate_a_tiny_pair_end_to_end(tmp_path, monkeypatch):
    """Train one tiny XKV, evaluate the pair into a grid folder, rebuild the page: the cell names the
    checkpoint relative to the root, the training log travels with it, and a rerun resumes (no new records)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators
    from latentwire.training.states import StateCache
    from latentwire.training.trainer import TrainConfig, train

    monkeypatch.setattr(translators, "ROOT", tmp_path)
    monkeypatch.setattr(translators, "run_dir", lambda m, s, r: tmp_path / "runs" / f"{m}_{s}_{r}")
    cfg = TrainConfig("xkv", "tiny-gemma3", "tiny-llama", tasks=("reasoning",), train_n=2, val_n=1, steps=1, batch=1,
                      eval_every=1)
    train(cfg, tmp_path / "runs" / "xkv_tiny-gemma3_tiny-llama", translators.agent("tiny-gemma3"),
          translators.agent("tiny-llama"), StateCache(tmp_path / "cache"), progress=False)
    argv = ["--pairs", "tiny-gemma3:tiny-llama", "--methods", "xkv", "--n", "2", "--tasks", "reasoning",
            "--threads", "1", "--grid", str(tmp_path / "grid")]
    translators.main(argv)
    cell = tmp_path / "grid" / "tiny-gemma3_tiny-llama_reasoning"
    config = json.loads((cell / "config.json").read_text())["config"]
    assert "translated(checkpoint='runs/xkv_tiny-gemma3_tiny-llama', context_aware=False)" in config["protocols"]
    records = (cell / "records.jsonl").read_text().splitlines()
    assert len(records) == 4 * 2  # alone, t2t, fullcontext, xkv × 2 held-out pairs
    assert (tmp_path / "grid" / "training" / "xkv_tiny-gemma3_tiny-llama.json").exists()
    page = (tmp_path / "grid" / "README.md").read_text()
    assert "| xkv |" in page and "tiny-gemma3 → tiny-llama" in page and "## Training runs" in page
    assert f"Ran in reasoning: {config['dtype']} on cpu: " in page  # how the cell ran, from its config
    translators.main(argv)  # resumes: nothing to add
    assert (cell / "records.jsonl").read_text().splitlines() == records


def test_a_checkpoint_saved_mid_run_is_not_evaluated(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators

    folder = tmp_path / "runs" / "xkv_a_b"
    folder.mkdir(parents=True)
    (folder / "translator.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text(json.dumps({"training": {"step": 100, "config": {"steps": 500}}}))
    monkeypatch.setattr(translators, "ROOT", tmp_path)
    monkeypatch.setattr(translators, "run_dir", lambda m, s, r: tmp_path / "runs" / f"{m}_{s}_{r}")
    with pytest.raises(SystemExit, match="no finished training for xkv"):
        translators.protocols("a", "b", ["xkv"])
    (folder / "config.json").write_text(json.dumps({"training": {"step": 500, "config": {"steps": 500}}}))
    specs = translators.protocols("a", "b", ["xkv"])
    cell = tmp_path / "grid" / "a_b_facts"
    translators.pin_checkpoints(cell, specs)
    translators.pin_checkpoints(cell, specs)  # the same weights: resumes
    (folder / "translator.safetensors").write_bytes(b"retrained")
    with pytest.raises(SystemExit, match="other weights"):
        translators.pin_checkpoints(cell, specs)


def test_steps_per_method_keep_variants_equal(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from train_translators import config, method_steps

    from latentwire.errors import ConfigError

    steps = method_steps(["xkv", "c2c", "c2c_input", "dense", "dense_aware"], 500, "c2c=300,dense_aware=200")
    assert steps == {"xkv": 500, "c2c": 300, "c2c_input": 300, "dense": 500, "dense_aware": 200}
    with pytest.raises(ConfigError, match="unknown methods \\['c2d'\\]"):
        method_steps(["c2c"], 500, "c2d=3")
    cfg = config("c2c_input", "a", "b", 300, 2)
    assert (cfg.method, cfg.params, cfg.lr_schedule, cfg.steps) == ("c2c", {"gate": "input"}, "cosine", 300)
    dense = config("dense_aware", "a", "b", 300, 2)
    assert (dense.stage1_steps, dense.steps, dense.context_aware) == (100, 400, True)


def test_controls_train_beside_their_methods_and_the_page_reads_transfer(tmp_path, monkeypatch):
    """benchmarks/translator_controls.py on a tiny pair: the method and its shuffled-sharer control train into
    separate folders (the control's training pairs lose their own sharer documents), both answer the same
    held-out pairs, and the page's verdicts pair method with control; a rerun adds no record."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translator_controls as tc
    import translators
    from latentwire.training.trainer import TrainConfig

    def run_dir(m, s, r, c="own"):
        return tmp_path / "runs" / f"{m if c == 'own' else f'{m}_{c}'}_{s}_{r}"

    made = []

    def config(m, s, r, steps, batch, c="own"):
        made.append(TrainConfig(m, s, r, tasks=("reasoning",), train_n=2, val_n=2, steps=1, batch=1, eval_every=1,
                                sharer_docs=c))
        return made[-1]

    for module in (tc, translators):
        monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(tc, "run_dir", run_dir)
    monkeypatch.setattr(tc, "config", config)
    argv = ["--pair", "tiny-gemma3:tiny-llama", "--methods", "xkv", "--tasks", "reasoning", "--n", "2",
            "--threads", "1", "--out", str(tmp_path / "out")]
    tc.main(argv)
    assert {c.sharer_docs for c in made} == {"own", "shuffled"}
    for name in ("xkv_tiny-gemma3_tiny-llama", "xkv_shuffled_tiny-gemma3_tiny-llama"):
        assert (tmp_path / "runs" / name / "translator.safetensors").exists()
        log = json.loads((tmp_path / "out" / "training" / f"{name}.json").read_text())
        assert log["config"]["sharer_docs"] == ("shuffled" if "shuffled" in name else "own")
    cell = tmp_path / "out" / "tiny-gemma3_tiny-llama_reasoning"
    records = (cell / "records.jsonl").read_text().splitlines()
    assert len(records) == 4 * 2  # alone, t2t, xkv, its control × 2 held-out pairs
    assert all(json.loads(r)["ttft"] is not None for r in records)
    pins = json.loads((cell / "checkpoints.json").read_text())
    assert set(pins) == {"xkv", "xkv_shuffled"} and pins["xkv"]["sha256"] != pins["xkv_shuffled"]["sha256"]
    page = (tmp_path / "out" / "README.md").read_text()
    assert "| xkv_shuffled | " in page and "| xkv transfers (method − its control) | xkv − xkv_shuffled |" in page
    assert "median ttft s" in page and "Holm–Bonferroni" in page
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [v["claim"] for v in result["verdicts"]][0] == "xkv transfers (method − its control)"
    tc.main(argv)  # resumes: trained runs are kept, no pair runs twice
    assert (cell / "records.jsonl").read_text().splitlines() == records
