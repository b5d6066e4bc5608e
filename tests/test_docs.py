"""Every ```python block of README.md and docs/*.md runs as written, on the CPU.

The blocks of one file run in order in one namespace, as a reader would paste them into one session, in a child
process (JAX on the CPU, a scratch working directory) so that what they set (autotune modes, jax config) stays out
of the test process. Each block is its own test item. Markers in the markdown, an HTML comment on the line before a
block's fence: `<!-- gpu -->` runs the block alone in its own child on the GPU where there is one (skipped elsewhere);
`<!-- skip: REASON -->` (the network, ...) reports it as skipped with that reason. Blocks after a failing one still
run, and a failure says which blocks failed before it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
_GPU = re.compile(r"^\s*<!--\s*gpu\s*-->\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(skip|gpu)\b")


@dataclasses.dataclass(frozen=True)
class Block:
  file: str      # relative to the repository root
  line: int      # the line of the opening fence, 1-based
  code: str
  skip: str | None  # the reason from a <!-- skip: ... --> marker, None when the block runs
  gpu: bool = False  # marked <!-- gpu -->: runs alone, on the GPU

  @property
  def id(self) -> str:
    return f"{self.file}:{self.line}"


def extract(text: str, name: str) -> list[Block]:
  """The ```python (or ```py) blocks of one markdown text, with their skip markers.

  Raises ValueError for a skip marker with no reason, or one that is not followed by a python block."""
  lines = text.splitlines()
  blocks, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      if _MARKER.match(lines[i]):
        nxt = next((j for j in range(i + 1, len(lines)) if lines[j].strip()), None)
        fence = _FENCE.match(lines[nxt]) if nxt is not None else None
        if not _GPU.match(lines[i]) and not (_SKIP.match(lines[i]) and _SKIP.match(lines[i]).group("reason")):
          raise ValueError(f"{name}:{i + 1}: a marker is <!-- gpu --> or <!-- skip: REASON --> with a reason")
        if fence is None or fence.group("info").split()[:1] not in (["python"], ["py"]):
          raise ValueError(f"{name}:{i + 1}: a marker must stand just before a ```python block")
      i += 1
      continue
    indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
    start, body = i, []
    i += 1
    while i < len(lines):
      close = _FENCE.match(lines[i])
      if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
          and not close.group("info").strip():
        break
      body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
      i += 1
    i += 1  # past the closing fence (or the end of an unclosed block)
    if info.split()[:1] not in (["python"], ["py"]):
      continue
    prev = next((j for j in range(start - 1, -1, -1) if lines[j].strip()), None)
    skip = _SKIP.match(lines[prev]) if prev is not None else None
    gpu = prev is not None and _GPU.match(lines[prev]) is not None
    blocks.append(Block(name, start + 1, textwrap.dedent("\n".join(body)) + "\n",
                        skip.group("reason") if skip else None, gpu))
  return blocks


def _all_blocks() -> list[Block]:
  out = []
  for path in DOC_FILES:
    if path.exists():
      out.extend(extract(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
  return out


# Runs the blocks given on stdin in one namespace, one JSON line per block in the file named by its argument (the
# blocks' own output goes to stdout and stderr).
_RUNNER = r"""
import json, sys, traceback
blocks = json.load(sys.stdin)
report = open(sys.argv[1], "w")
namespace = {"__name__": "__main__"}
failed = []
for b in blocks:
  try:
    exec(compile(b["code"], b["id"], "exec"), namespace)
  except BaseException:  # noqa: BLE001 - SystemExit too: a block must not end the reader's session
    note = f"\n(after the failure of {', '.join(failed)}, which may be the cause)" if failed else ""
    failed.append(b["id"])
    print(json.dumps({"id": b["id"], "ok": False, "error": traceback.format_exc() + note}), file=report, flush=True)
  else:
    print(json.dumps({"id": b["id"], "ok": True}), file=report, flush=True)
"""


def run_blocks(blocks: list[Block], cwd: pathlib.Path, cpu: bool = True) -> dict[str, dict]:
  """Runs the blocks (in order, one namespace) in a child Python, on the CPU unless cpu=False (JAX's default
  platform); {block id: result}."""
  # The autotune cache in the scratch directory: a block that tunes must not write the user's cache.
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", JAXCONV_CACHE_DIR=str(cwd))
  if cpu:
    env["JAX_PLATFORMS"] = "cpu"
  env.pop("XLA_FLAGS", None)
  payload = json.dumps([{"id": b.id, "code": b.code} for b in blocks])
  # A hang guard only: a block that takes this long is stuck.
  report = cwd / "doc-blocks.jsonl"
  report.unlink(missing_ok=True)
  proc = subprocess.run([sys.executable, "-c", _RUNNER, str(report)], input=payload, capture_output=True, text=True,
                        cwd=cwd, env=env, timeout=1800)
  results = {}
  for line in (report.read_text().splitlines() if report.exists() else []):
    r = json.loads(line)
    results[r["id"]] = r
  for b in blocks:  # the child died before reporting this block
    results.setdefault(b.id, {"id": b.id, "ok": False, "error": f"the runner exited with {proc.returncode} "
                              f"before this block reported:\n{proc.stderr[-4000:]}"})
  return results


@functools.cache
def _file_results(file: str, scratch: str) -> dict[str, dict]:
  blocks = [b for b in _all_blocks() if b.file == file and b.skip is None and not b.gpu]
  return run_blocks(blocks, pathlib.Path(scratch))


BLOCKS = _all_blocks()


def _has_gpu() -> bool:
  import jax
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs(block, tmp_path_factory):
  if block.skip is not None:
    pytest.skip(f"{block.id}: {block.skip}")
  if block.gpu and not _has_gpu():
    pytest.skip(f"{block.id}: needs a GPU")
  scratch = tmp_path_factory.getbasetemp() / ("docs-" + re.sub(r"\W", "_", block.file))
  scratch.mkdir(exist_ok=True)
  if block.gpu:
    result = run_blocks([block], scratch, cpu=False)[block.id]
  else:
    result = _file_results(block.file, str(scratch))[block.id]
  if not result["ok"]:
    pytest.fail(f"{block.id} failed:\n{result['error']}\n--- the block ---\n{block.code}", pytrace=False)


def test_the_docs_have_python_blocks():
  assert (ROOT / "README.md").exists()
  assert BLOCKS, "no ```python block found in README.md or docs/*.md"


# The extraction and the runner themselves, on made-up markdown.
_SAMPLE = """\
# Title

```python
x = 2
```

Some text.

```bash
echo not python
```

<!-- skip: needs the network -->
```python
import urllib.request; urllib.request.urlopen("https://example.com")
```

<!-- gpu -->
```python
import jax; jax.devices("gpu")
```

- a list item with a block:

  ```py
  y = x * 21
  ```
"""


def test_extract_finds_python_blocks_markers_and_lines():
  blocks = extract(_SAMPLE, "sample.md")
  assert [(b.line, b.skip, b.gpu) for b in blocks] == [(3, None, False), (14, "needs the network", False),
                                                       (19, None, True), (25, None, False)]
  assert blocks[0].code == "x = 2\n" and blocks[3].code == "y = x * 21\n"


@pytest.mark.parametrize("bad", ["<!-- skip -->\n```python\npass\n```\n", "<!-- skip: -->\n```python\npass\n```\n",
                                 "<!-- skip: gpu -->\n```bash\nls\n```\n", "<!-- gpu -->\n```bash\nls\n```\n"])
def test_a_marker_without_a_reason_or_a_python_block_is_an_error(bad):
  with pytest.raises(ValueError, match="sample.md:1"):
    extract(bad, "sample.md")


def test_the_runner_shares_one_namespace_and_reports_failures(tmp_path):
  blocks = [b for b in extract(_SAMPLE, "sample.md") if b.skip is None and not b.gpu]
  blocks.append(Block("sample.md", 30, "assert y == 41, y\n", None))
  blocks.append(Block("sample.md", 40, "print({'z': 1})\n", None))  # output that looks like the report's
  results = run_blocks(blocks, tmp_path)
  assert results["sample.md:3"]["ok"] and results["sample.md:25"]["ok"]
  assert not results["sample.md:30"]["ok"] and "AssertionError: 42" in results["sample.md:30"]["error"]
  assert results["sample.md:40"]["ok"]  # the blocks after a failure still run
  blocks.append(Block("sample.md", 50, "print(undefined_name)\n", None))
  late = run_blocks(blocks, tmp_path)["sample.md:50"]
  assert not late["ok"] and "NameError" in late["error"] and "after the failure of sample.md:30" in late["error"]
