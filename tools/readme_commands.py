"""Print the commands of README.md's first ```bash block, one per line (comments dropped).

`.ci/run` runs exactly these, so the README and CI cannot drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path


def readme_commands(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("```bash") + 1
    end = lines.index("```", start)
    return [
        line.strip()
        for line in lines[start:end]
        if line.strip() and not line.lstrip().startswith("#")
    ]


if __name__ == "__main__":
    print("\n".join(readme_commands(Path(sys.argv[1]).read_text())))
