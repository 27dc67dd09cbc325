"""What a newcomer reads: the Python example in docs/certify.md runs as written, on the demo classifier and
small n (its imports are the public paths, its calls the public signatures: a renamed or moved name fails here);
the README and the option tables keep their lines short."""

from __future__ import annotations

from pathlib import Path

from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]


def test_the_python_example_in_docs_certify_md_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "certify.md").read_text()
    block = text.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    small = {  # what the example names -> the demo's, on the CPU, with small n
        '"model.safetensors"': repr(str(DEMO_CHECKPOINT)),
        'torch.device("cuda"), "fp16"': 'torch.device("cpu"), "fp32"',
        "n0=100, n=10_000": "n0=10, n=50",
        "SamplingPlan.certify(100, 10_000)": "SamplingPlan.certify(10, 50)",
        '"/imagenet/val"': '"demo"',
        '"r.tsv"': repr(str(tmp_path / "r.tsv")),
        "skip=50, fast=True)": "skip=50, n0=10, n=50, max_images=2, progress=False)",
    }
    for name, value in small.items():
        assert name in block, f"docs/certify.md's example no longer says {name}: update this test with it"
        block = block.replace(name, value)
    digits = demo_digits("test")
    images = [(i, digits.images[i], int(digits.labels[i])) for i in range(3)]
    monkeypatch.chdir(tmp_path)
    shown: list = []
    namespace = {"image": digits.images[0], "index": 0, "images": images, "print": lambda *a: shown.append(a)}
    exec(compile(block, "docs/certify.md", "exec"), namespace)
    streamed, rows, (images_done, rate) = shown[:3], shown[3:-1], shown[-1]
    assert [s[0] for s in streamed] == [0, 1, 2] and all(s[1].n == 50 for s in streamed)  # index, certificate
    assert len(rows) == 2 and images_done == 2 and rate > 0  # on_row's rows, result.images, result.samples_per_s
    assert (tmp_path / "r.tsv").read_text().count("\n") == 3  # header + 2 rows


def _option_tables(text: str) -> list[list[str]]:
    """The Markdown tables whose header's first cell is ``option``: each a list of its lines."""
    tables: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            inside = False
        elif inside:
            tables[-1].append(line)
        else:
            inside = True
            tables.append([line])
    return [table for table in tables if table[0].split("|")[1].strip().lower() == "option"]


def test_the_readme_and_every_option_table_have_no_line_over_200_characters():
    """A newcomer reads the README and the option tables line by line: details go below the tables."""
    long = [f"README.md:{number}" for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
            if len(line) > 200]
    for page in sorted((ROOT / "docs").glob("*.md")):
        tables = _option_tables(page.read_text())
        long += [f"{page.name}: {line[:60]}" for table in tables for line in table if len(line) > 200]
    assert not long, long
