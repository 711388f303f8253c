"""``bench/results.py``: RESULTS.md from a bench log, whole or one section at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "results.py"


def results(tmp_path: Path, log: str, *extra: str) -> str:
    path = tmp_path / "bench.log"
    path.write_text(log, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_a_section_re_run_replaces_only_its_own_and_says_when(tmp_path: Path) -> None:
    whole = results(tmp_path, "== bench/a_bench.py\nx: 1\n== bench/b_bench.py\ny: 2\nz: a|b\n")
    assert "| `y` | 2 |" in whole and "| `z` | a\\|b |" in whole
    file = tmp_path / "RESULTS.md"
    file.write_text(whole, encoding="utf-8")
    # nothing re-run: the file comes back byte for byte
    assert results(tmp_path, "", "--update", str(file)) == whole
    updated = results(
        tmp_path, "== bench/b_bench.py\ny: 3\n== bench/c_bench.py\nw: 4\n", "--update", str(file)
    )
    before, after = whole.split("## `bench/b_bench.py`"), updated.split("## `bench/b_bench.py`")
    assert after[0] == before[0]  # the header and section a are untouched
    assert "| `y` | 3 |" in after[1] and "| `z` |" not in after[1]
    assert after[1].count("Re-run alone on ") == 2  # b, and c (new, at the end)
    assert updated.rstrip().endswith("| `w` | 4 |")


def test_an_update_that_names_no_file_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bench.log"
    path.write_text("== bench/a_bench.py\nx: 1\n", encoding="utf-8")
    for extra in (["--update"], ["--updat", "RESULTS.md"], ["RESULTS.md"]):
        out = subprocess.run(
            [sys.executable, str(SCRIPT), str(path), *extra], capture_output=True, text=True
        )
        assert out.returncode == 2 and not out.stdout
        assert "--update RESULTS.md" in out.stderr


def test_a_merge_replaces_only_the_keys_re_run_and_keeps_the_rest(tmp_path: Path) -> None:
    """A bench run in part (``--sections``) refreshes its keys and loses none of the others."""
    whole = results(tmp_path, "== bench/a_bench.py\nx: 1\n== bench/b_bench.py\ny: 2\nz: 5\n")
    file = tmp_path / "RESULTS.md"
    file.write_text(whole, encoding="utf-8")
    once = results(tmp_path, "== bench/b_bench.py\nz: 6\nw: 7\n", "--merge", str(file))
    assert once.split("## `bench/b_bench.py`")[0] == whole.split("## `bench/b_bench.py`")[0]
    b = once.split("## `bench/b_bench.py`")[1]
    rows = [line for line in b.splitlines() if line.startswith("| `")]
    assert rows == ["| `y` | 2 |", "| `z` | 6 |", "| `w` | 7 |"]  # in place, new at the end
    assert "Keys re-run alone on " in b and "(`z`, `w`)" in b
    file.write_text(once, encoding="utf-8")
    twice = results(tmp_path, "== bench/b_bench.py\ny: 3\n", "--merge", str(file))
    b = twice.split("## `bench/b_bench.py`")[1]
    assert [line for line in b.splitlines() if line.startswith("| `")] == [
        "| `y` | 3 |",
        "| `z` | 6 |",
        "| `w` | 7 |",
    ]
    assert b.index("(`y`)") < b.index("(`z`, `w`)")  # the newest note first; the older stays


def test_keys_before_any_bench_line_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """A bench run by hand without its ``== bench/<name>.py`` line would update nothing."""
    path = tmp_path / "bench.log"
    path.write_text("seed.sufficient.qosflow_vs_best_baseline: 1.000\n", encoding="utf-8")
    file = tmp_path / "RESULTS.md"
    file.write_text("# Benchmark results\n", encoding="utf-8")
    for extra in ([], ["--update", str(file)], ["--merge", str(file)]):
        out = subprocess.run(
            [sys.executable, str(SCRIPT), str(path), *extra], capture_output=True, text=True
        )
        assert out.returncode == 2 and not out.stdout
        assert "`seed.sufficient.qosflow_vs_best_baseline: 1.000` comes before" in out.stderr
