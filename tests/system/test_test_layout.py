"""The tests mirror the source tree, so the test of a module is found by its name and dies with it.

``tests/<a>/<b>/test_<c>.py`` tests the module ``<a>/<b>/<c>.py`` or the package ``<a>/<b>/<c>/`` (one with an
``__init__.py``); a test whose module is deleted or renamed is reported here instead of lingering. Whole-system
tests (cluster runs, process faults, compose, load, README commands, import contract, ...) live in
``tests/system/`` under descriptive names and are exempt. Helpers (conftest.py, datafiles.py, browser.py,
sim_support.py, procs.py, chaos.py) sit in ``tests/`` itself and are not named ``test_*``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXEMPT = "system"  # tests/system/: tests of the whole system, not of one module


def module_under_test(test: Path, tests: Path) -> Path:
    """``tests/a/b/test_c.py`` -> ``<root>/a/b/c`` (without suffix: the module is ``c.py`` or the package ``c/``)."""
    rel = test.relative_to(tests)
    return tests.parent.joinpath(*rel.parts[:-1], rel.name.removeprefix("test_").removesuffix(".py"))


def orphan_tests(root: Path) -> list[str]:
    """Every ``tests/**/test_*.py`` outside ``tests/system/`` whose source module or package does not exist."""
    tests = root / "tests"
    orphans = []
    for test in sorted(tests.rglob("test_*.py")):
        rel = test.relative_to(tests)
        if rel.parts[0] == EXEMPT:
            continue
        module = module_under_test(test, tests)
        if not (module.with_name(module.name + ".py").is_file() or (module / "__init__.py").is_file()):
            name = module.relative_to(root).as_posix()
            orphans.append(f"tests/{rel.as_posix()}: neither {name}.py nor a package {name}/ exists")
    return orphans


def test_every_test_mirrors_an_existing_source_module() -> None:
    orphans = orphan_tests(ROOT)
    assert not orphans, "tests of missing modules (move or delete them with their module):\n" + "\n".join(orphans)


def test_no_init_files_under_tests() -> None:
    """pyproject puts tests/ on sys.path: a tests/fedent/__init__.py would shadow the real fedent package."""
    assert sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("__init__.py")) == []


def test_the_checker_reports_orphans_and_accepts_modules_packages_and_system_tests(tmp_path: Path) -> None:
    def touch(rel: str) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    for rel in ["pkg/__init__.py", "pkg/mod.py", "pkg/sub/__init__.py", "pkg/sub/deep.py", "pkg/__main__.py",
                "pkg/leftover/__pycache__/x.pyc",  # a package directory left behind without __init__.py
                "tests/conftest.py", "tests/helper.py",
                "tests/pkg/test_mod.py", "tests/pkg/test_sub.py", "tests/pkg/sub/test_deep.py",
                "tests/pkg/test___main__.py", "tests/system/test_whole_cluster.py",
                "tests/pkg/test_gone.py", "tests/pkg/sub/test_mod.py", "tests/pkg/test_leftover.py",
                "tests/test_stray.py"]:
        touch(rel)
    assert orphan_tests(tmp_path) == [
        "tests/pkg/sub/test_mod.py: neither pkg/sub/mod.py nor a package pkg/sub/mod/ exists",
        "tests/pkg/test_gone.py: neither pkg/gone.py nor a package pkg/gone/ exists",
        "tests/pkg/test_leftover.py: neither pkg/leftover.py nor a package pkg/leftover/ exists",
        "tests/test_stray.py: neither stray.py nor a package stray/ exists",
    ]
    (tmp_path / "pkg" / "gone.py").write_text("")  # the module comes back: its test is no longer an orphan
    assert "tests/pkg/test_gone.py" not in "".join(orphan_tests(tmp_path))
