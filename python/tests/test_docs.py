"""Every ```python example of docs/python.md runs, from the repository root, as written."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PAGE = ROOT / "docs" / "python.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_page_has_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("code", EXAMPLES, ids=[f"example{i + 1}" for i in range(len(EXAMPLES))])
def test_example_runs(code):
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, f"docs/python.md example failed:\n{code}\n--- stderr:\n{r.stderr}"
