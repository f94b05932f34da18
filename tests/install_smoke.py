"""The core install, checked as a user meets it (`make test-current` runs this in .venv-current: the newest
transformers 5.x, latentwire installed as a package, no kvpress). Not collected by pytest; exits non-zero on any
failure.

1. `latentwire models` lists the bundled models.
2. A 2-episode `latentwire bench run --task facts --protocols "text,cacheback(ratio=8)"` on the default model
   (the 500-token episodes: 3 senders × ~500 tokens)
   writes its records, both protocols answering without error.
3. A kvpress selector fails with MissingExtraError naming the `kvpress` extra, before any compute.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    import latentwire
    import transformers

    exe = Path(sys.executable).with_name("latentwire")
    assert "site-packages" in latentwire.__file__, f"not the installed package: {latentwire.__file__}"
    print(f"latentwire {latentwire.__version__} (installed) on transformers {transformers.__version__}")

    listing = subprocess.run([str(exe), "models"], capture_output=True, text=True, check=True).stdout
    assert "smollm2-135m" in listing and "qwen2.5-coder-0.5b" in listing, listing
    print("latentwire models: ok")

    out = Path(tempfile.mkdtemp(prefix="lw-smoke-"))
    try:
        subprocess.run([str(exe), "bench", "run", "--task", "facts", "--n", "2", "--protocols",
                        "text,cacheback(ratio=8)", "--filter", "length_bucket=500", "--dtype", "float32",
                        "--out", str(out)], check=True)
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        assert len(records) == 4 and all(r["error"] is None for r in records), records
        print("bench run, 2 episodes x 2 protocols: ok")
    finally:
        shutil.rmtree(out, ignore_errors=True)

    from latentwire.errors import MissingExtraError
    from latentwire.protocols import get_protocol

    try:
        get_protocol("cacheback", selector="snapkv")
    except MissingExtraError as e:
        assert e.extra == "kvpress" and "latentwire[kvpress]" in str(e), e
        print(f"kvpress selector without the extra: {type(e).__name__}: {e}")
    else:
        raise AssertionError("a kvpress selector was built without kvpress installed")


if __name__ == "__main__":
    main()
