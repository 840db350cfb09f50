"""Every shell command in README.md, docs/*.md and examples/**/README*, as a newcomer pastes it into a fresh
shell after ``make run``: no venv activated, so a bare ``fedent``, ``python`` or ``pip`` would be the wrong one.

Commands are parsed from the ```bash / ```sh blocks (continuations joined, comments dropped); every fenced block
must name its language, so a command block cannot hide in an unlabelled one. For each command:

- ``.venv/bin/fedent SUB ...`` and ``.venv/bin/python -m MODULE ...`` are parsed by the real argparse parser
  (tests/cli_parsers.py), so a flag the code does not accept fails here; ``make T`` names a Makefile target; a
  script (``tools/x.sh``, ``deploy/k8s/make-pki.sh``) exists and is executable; Docker, kubectl, kind, grpcurl
  and the like are checked for syntax only (``bash -n`` on the whole block);
- the cheap ones (RUN_VERBATIM: certificates, the plug-in list, a partition on the OS copy of Fashion-MNIST)
  also run, exactly as written, with ``bash -c`` in a scratch directory that holds the repository's ``.venv``,
  ``configs/``, ``examples/``, ``tools/`` and ``deploy/`` as links; each page's commands run in order, so a file
  a later command reads (the dashboard's ``--token-file``) must be made by an earlier one on the same page.

The simulator commands, the README's multi-machine block and the digits example run (made small or localised)
in tests/system/test_readme_commands.py, test_readme_cluster.py and test_digits_example.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_parsers import parse

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/README*")})
SHELL = {"bash", "sh"}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
VENV_FEDENT, VENV_PYTHON, VENV_PIP = ".venv/bin/fedent", ".venv/bin/python", ".venv/bin/pip"
BARE = {"fedent", "python", "python3", "pip", "pip3", "pytest", "ruff", "mypy", "uvicorn", "tensorboard"}
EXTERNAL = {"docker", "docker-compose", "kubectl", "kind", "grpcurl", "open", "xdg-open", "curl", "export", "base64"}
REDIRECTS = ("|", "&", "&&", ";", ">", ">>", "2>&1")
SYSTEM_DATA = Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
PLACEHOLDER = re.compile(r"<([a-z][a-z-]*)>")  # runs/<run-id>, client-<cid>: the reader fills it in
LINKED = ("configs", "examples", "tools", "deploy")


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str  # as written (continuations joined), for bash -c
    argv: list[str]  # the program and its arguments: assignments, nohup, redirections and pipes dropped

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text(encoding="utf-8")
    return [(m.group(1).strip(), m.group(2), text[: m.start()].count("\n") + 1) for m in FENCE.finditer(text)]


def _expand(token: str, env: dict[str, str]) -> str:
    """$VAR set by an earlier line of the block (docs/results.md's ROWS=...)."""
    return re.sub(r"\$([A-Z_][A-Z0-9_]*)", lambda m: env.get(m.group(1), m.group(0)), token)


def commands(page: Path) -> list[Command]:
    out = []
    for lang, body, start in blocks(page):
        if lang not in SHELL:
            continue
        env: dict[str, str] = {}
        logical: list[tuple[int, str]] = []  # (first line number, the line with its continuations joined)
        pending: tuple[int, str] | None = None
        for offset, raw in enumerate(body.split("\n")):
            first, text = pending if pending else (start + 1 + offset, "")
            text += raw
            pending = (first, text[:-1]) if raw.endswith("\\") else None
            if pending is None:
                logical.append((first, text))
        for lineno, line in logical:
            tokens = shlex.split(line, comments=True)
            if not tokens:
                continue
            while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
                name, _, value = tokens.pop(0).partition("=")
                env[name] = value
            if tokens and tokens[0] == "nohup":
                tokens.pop(0)
            cut = next((i for i, t in enumerate(tokens) if t in REDIRECTS or t.startswith((">", "2>"))), len(tokens))
            argv = [_expand(t, env) for t in tokens[:cut]]
            if argv:
                out.append(Command(page, lineno, line.strip(), argv))
    return out


ALL = [c for page in PAGES for c in commands(page)]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*):", (ROOT / "Makefile").read_text(), re.M))


def check(cmd: Command) -> None:
    """Raise AssertionError when the command would not run from a fresh shell (program or flags)."""
    prog, args = cmd.argv[0], cmd.argv[1:]
    assert prog not in BARE, f"{cmd}\n  `{prog}` is whatever is on PATH in a fresh shell: write .venv/bin/{prog}"
    if prog == VENV_FEDENT:
        parse(["fedent", *args])
    elif prog == VENV_PYTHON:
        assert args[:1] == ["-m"], f"{cmd}: only `.venv/bin/python -m MODULE` is expected"
        if args[1] == "digits_example.prepare":
            sys.path.insert(0, str(ROOT / "examples" / "digits"))
        if args[1] == "server.dashboard_cli":  # `fedent dashboard` without fedent's other subcommands
            parse(["fedent", "dashboard", *args[2:]])
        else:
            parse(["python", *args])
    elif prog == VENV_PIP:
        assert args[:2] == ["install", "-e"], cmd
        target = args[2].split("[")[0]
        assert (ROOT / target).is_dir(), f"{cmd}: no {target}"
    elif prog == "make":
        assert set(args) <= makefile_targets(), f"{cmd}: not a Makefile target"
    elif prog == "bash" or "/" in prog:
        script = ROOT / (args[0] if prog == "bash" else prog)
        assert script.is_file(), f"{cmd}: no {script}"
        assert prog == "bash" or os.access(script, os.X_OK), f"{cmd}: {script} is not executable"
    else:
        assert prog in EXTERNAL, f"{cmd}: unknown program {prog!r}: say in this test how to check it"


def run_verbatim(cmd: Command) -> bool:
    """The cheap commands that run exactly as written (seconds, no network, no second machine)."""
    a = cmd.argv
    if "--help" in a or "-h" in a:
        return True
    if a[0] != VENV_FEDENT:
        return False
    if a[1] in ("certs", "plugins"):
        return True
    return a[1] == "partition" and "--download" not in a and SYSTEM_DATA.exists()


def test_the_pages_have_commands_and_every_fence_names_its_language() -> None:
    assert len(PAGES) >= 10 and len(ALL) >= 30, (len(PAGES), len(ALL))
    unlabelled = [f"{p.relative_to(ROOT)}:{line}" for p in PAGES for lang, _, line in blocks(p) if not lang]
    assert not unlabelled, f"fenced blocks without a language (```bash for commands, ```text otherwise): {unlabelled}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_is_valid_shell(page: Path) -> None:
    for lang, body, line in blocks(page):
        if lang in SHELL:
            text = PLACEHOLDER.sub(lambda m: m.group(1).upper().replace("-", "_"), body)  # runs/<run-id>: a name
            res = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
            assert res.returncode == 0, f"{page.relative_to(ROOT)}:{line}: {res.stderr}"


def test_no_command_needs_an_activated_venv_and_every_flag_exists() -> None:
    failures = []
    for cmd in ALL:
        try:
            check(cmd)
        except (AssertionError, Exception) as e:  # ParseError, SystemExit from a parser
            failures.append(f"{cmd}\n    {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures)


def test_the_check_catches_a_bare_command() -> None:
    bad = Command(ROOT / "README.md", 1, "fedent simulate --config c.yaml", ["fedent", "simulate", "--config", "c"])
    with pytest.raises(AssertionError, match="fresh shell"):
        check(bad)
    with pytest.raises(Exception, match="unrecognized arguments"):
        check(Command(ROOT / "README.md", 1, "", [VENV_FEDENT, "simulate", "--config", "c", "--no-such-flag"]))


def _scratch(tmp_path: Path) -> dict[str, str]:
    venv = Path(sys.prefix)
    if not (venv / "bin" / "fedent").exists():
        pytest.skip(f"this interpreter's environment ({venv}) has no fedent script (not a venv with fedent)")
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg", "LANG": "C.UTF-8",
            "PYTHONPATH": str(ROOT)}  # the code under test: this checkout, whichever checkout the venv came from


def test_the_cheap_commands_run_verbatim_in_a_fresh_shell(tmp_path: Path) -> None:
    ran = 0
    for page in PAGES:
        work = tmp_path / page.relative_to(ROOT).as_posix().replace("/", "_")
        work.mkdir()
        env = _scratch(work)
        for cmd in commands(page):
            if run_verbatim(cmd):
                res = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True, text=True,
                                     timeout=300)
                assert res.returncode == 0, f"{cmd}\nexit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
                ran += 1
            elif cmd.argv[0] == VENV_FEDENT and cmd.argv[1] == "dashboard" and "--token-file" in cmd.argv:
                token = cmd.argv[cmd.argv.index("--token-file") + 1]
                assert (work / os.path.expanduser(token).replace(str(work) + "/", "")).is_file() and \
                    not token.startswith("~"), f"{cmd}\n  {token}: no earlier command on this page makes it"
    assert ran >= 5, ran


def test_counts() -> None:
    """How many doc commands run verbatim here and how many are only checked (printed with -s)."""
    verbatim = [c for c in ALL if run_verbatim(c)]
    print(f"\ndoc commands: {len(ALL)}; run verbatim here: {len(verbatim)}; checked by parser/syntax: "
          f"{len(ALL) - len(verbatim)}")
    assert verbatim
