"""The texts that tell a user how to install ksquad, and the commands they give: read by
tests/chart/test_install_texts.py (each gives every step the seed Run needs) and followed, the README's, by
tests/chart/ (its release is installed by the README's commands, its seed test runs the rest)."""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parents[2]
TEXTS = {
    "README.md": ROOT / "README.md",
    "docs/operating.md": ROOT / "docs" / "operating.md",
    "NOTES.txt": ROOT / "charts" / "ksquad" / "templates" / "NOTES.txt",
}


def commands(text: str) -> list[str]:
    """The shell commands a text gives (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        line.split("   #")[0].split("  #")[0].strip()
        for line in joined.splitlines()
        if re.match(r"\s*(kubectl|helm) ", line)
    ]


def block_steps(name: str, heading: str) -> list[str]:
    """The kubectl and helm commands of the first ```sh block under `heading` in text `name`, in order."""
    text = TEXTS[name].read_text()
    section = text[text.index(heading) :]
    start = section.index("```sh")
    return commands(section[start : section.index("```", start + 5)])


def readme_cluster_steps() -> list[str]:
    """The README's "On a cluster" block (`make images` is the test bed's own build: testbed.images)."""
    return block_steps("README.md", "## On a cluster")


def helm_values(step: str) -> dict[str, str]:
    """A helm command's `--set` values, by key."""
    args = shlex.split(step)
    return dict(args[i + 1].split("=", 1) for i, arg in enumerate(args) if arg == "--set")
