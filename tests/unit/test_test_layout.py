"""Unit tests stay unit tests (ARCHITECTURE.md, Tests): no file under ``tests/unit``
starts a Dask cluster or client or runs a whole release; those tests live under
``tests/system``.

Each file is read with :mod:`ast`, its imports resolved to the names they bind, and
these entry points are refused:

* a Dask cluster or client: ``LocalCluster``, a call of ``Client(...)`` or of
  ``dpdask.pipeline.cluster.connect``, ``distributed``'s test harness
  (``distributed.utils_test``), or a fixture (in ``tests/conftest.py`` or the file)
  that does any of this;
* a whole release: ``dpdask.release(...)`` (wherever imported from), ``Release.to_zarr``,
  ``run_spec``, the command line's ``main(["run", ...])`` (or ``python -m dpdask.cli
  run`` in a subprocess) and ``Session(...).release(...)``;
* a class or function imported from another test module that does any of this (a state
  machine of ``tests/system`` that runs releases, say).

The check is syntactic: a command line whose verb it cannot read is refused too, so
name the verb in a literal list.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent  # where ``tests.<folder>.<module>`` imports are looked up
UNIT = TESTS / "unit"
CONFTESTS = (TESTS / "conftest.py", UNIT / "conftest.py")


def _bound_names(tree: ast.AST) -> dict[str, str]:
    """``{local name: qualified name}`` of every import in the file."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _qualified(node: ast.AST, names: dict[str, str]) -> str | None:
    """The dotted name an expression refers to, through the file's imports."""
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _qualified(node.value, names)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _is_release(qualified: str | None) -> bool:
    """``dpdask.release`` the function, from the package or any of its modules."""
    if qualified is None or not qualified.startswith("dpdask."):
        return False
    return qualified == "dpdask.release" or (
        qualified.startswith("dpdask.graph.") and qualified.endswith(".release")
    )


def _is_client(qualified: str | None, last: str) -> bool:
    """A call of ``distributed.Client`` (or an unimported ``Client``), or of dpdask's
    ``pipeline.cluster.connect``, which starts or joins a cluster."""
    q = qualified or ""
    if q.startswith("dpdask.") and q.endswith(".cluster.connect"):
        return True
    return q == "Client" or (
        q.startswith(("distributed.", "dask.distributed.")) and last == "Client"
    )


def _assigned_lists(scope: ast.AST) -> dict[str, ast.expr]:
    """``{name: value}`` of the simple assignments in a function (or the module)."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                out[target.id] = node.value
    return out


def _first_word(arg: ast.expr, lists: dict[str, ast.expr], depth: int = 0) -> str | None:
    """The first string of a command line built from literals, ``+`` and ``*`` unpacking;
    ``None`` where it cannot be read."""
    if depth > 8:
        return None
    if isinstance(arg, ast.Name) and arg.id in lists:
        return _first_word(lists[arg.id], lists, depth + 1)
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        return _first_word(arg.left, lists, depth + 1)
    if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts:
        first = arg.elts[0]
        if isinstance(first, ast.Starred):
            return _first_word(first.value, lists, depth + 1)
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


class _Scan(ast.NodeVisitor):
    """Walks one file, noting every entry point with its line."""

    def __init__(
        self,
        names: dict[str, str],
        module: ast.Module,
        fixtures: set[str],
        follow: bool = True,
        sessions: set[str] | None = None,
    ) -> None:
        self.names = names
        self.follow = follow  # whether imports from other test modules are looked into
        self.fixtures = fixtures
        self.found: list[tuple[int, str]] = []
        self.scopes: list[ast.AST] = [module]
        self.sessions = self._session_names(module) if sessions is None else sessions

    def _session_names(self, module: ast.Module) -> set[str]:
        """Names bound to a ``Session(...)``, by assignment or ``with ... as``."""
        bound: set[str] = set()

        def is_session(value: ast.expr | None) -> bool:
            if not isinstance(value, ast.Call):
                return False
            q = _qualified(value.func, self.names) or ""
            return q.startswith("dpdask") and q.endswith(".Session")

        for node in ast.walk(module):
            if isinstance(node, ast.Assign) and is_session(node.value):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.withitem) and is_session(node.context_expr):
                if isinstance(node.optional_vars, ast.Name):
                    bound.add(node.optional_vars.id)
        return bound

    def note(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        params = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
        for name in sorted(params & self.fixtures - _parametrized(node)):
            self.note(node, f"{node.name} uses the fixture {name!r}, which starts a cluster")
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if self.follow and (node.module or "").startswith("tests.") and not node.level:
            for alias in node.names:
                if _imported_definition_offends(node.module, alias.name):
                    self.note(node, f"imports {alias.name} from {node.module}, which does")
        if node.module and node.module.startswith("distributed.utils_test"):
            self.note(node, "imports distributed's test harness (a cluster per test)")
        if (node.module or "").startswith("dpdask") and "run_spec" in {a.name for a in node.names}:
            self.note(node, "runs a whole release (run_spec)")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("distributed.utils_test"):
                self.note(node, "imports distributed's test harness (a cluster per test)")

    def visit_Name(self, node: ast.Name) -> None:
        q = self.names.get(node.id, node.id)
        if node.id == "LocalCluster" or q.endswith(".LocalCluster"):
            self.note(node, "starts a LocalCluster")
        elif q.endswith("run_spec") and q.startswith("dpdask"):
            self.note(node, "runs a whole release (run_spec)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "LocalCluster":
            self.note(node, "starts a LocalCluster")
        elif node.attr == "run_spec":
            self.note(node, "runs a whole release (run_spec)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        q = _qualified(func, self.names)
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if _is_client(q, last):
            self.note(node, "starts a Dask Client or cluster")
        elif _is_release(q):
            self.note(node, "runs a whole release (dpdask.release)")
        elif isinstance(func, ast.Attribute) and func.attr == "to_zarr":
            receiver = func.value
            rq = _qualified(
                receiver.func if isinstance(receiver, ast.Call) else receiver, self.names
            )
            if (rq or "").endswith(".Release") or (
                isinstance(receiver, ast.Call) and _is_release(rq)
            ):
                self.note(node, "runs a whole release (Release.to_zarr)")
        elif isinstance(func, ast.Attribute) and func.attr == "release":
            receiver = func.value
            inner = receiver.func if isinstance(receiver, ast.Call) else None
            iq = _qualified(inner, self.names) if inner is not None else None
            if (isinstance(receiver, ast.Name) and receiver.id in self.sessions) or (
                (iq or "").startswith("dpdask") and (iq or "").endswith(".Session")
            ):
                self.note(node, "runs a whole release (Session.release)")
        if (q or "").startswith("dpdask.cli") and q.endswith(".main"):
            self._cli(node)
        for arg in node.args:
            words = _strings(arg)
            if "-m" in words and "run" in words and {"dpdask", "dpdask.cli"} & set(words):
                self.note(node, "runs a whole release (python -m dpdask.cli run)")
        self.generic_visit(node)

    def _cli(self, node: ast.Call) -> None:
        if not node.args:
            self.note(node, "calls the command line without a command this check can read")
            return
        lists = {}
        for scope in self.scopes:
            lists.update(_assigned_lists(scope))
        word = _first_word(node.args[0], lists)
        if word is None:
            self.note(node, "calls the command line with a command this check cannot read")
        elif word == "run":
            self.note(node, "runs a whole release (the command line's run)")


@functools.cache
def _parsed(path: pathlib.Path) -> ast.Module | None:
    return ast.parse(path.read_text()) if path.is_file() else None


def _imported_definition_offends(module: str, name: str) -> bool:
    """Whether the top-level class or function ``name`` of the test module ``module``
    starts a cluster or runs a release itself (one level: its own body)."""
    tree = _parsed(ROOT.joinpath(*module.split(".")).with_suffix(".py"))
    if tree is None:
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            scan = _Scan(_bound_names(tree), tree, set(), follow=False)
            scan.visit(node)
            return bool(scan.found)
    return False


def _parametrized(node: ast.FunctionDef) -> set[str]:
    """Argument names a ``pytest.mark.parametrize`` on the function gives values to."""
    out: set[str] = set()
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize":
            first = dec.args[0] if dec.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                out |= {s.strip() for s in first.value.split(",")}
            else:
                out |= set(_strings(first)) if first is not None else set()
    return out


def _is_fixture(node: ast.FunctionDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if getattr(target, "attr", getattr(target, "id", "")) == "fixture":
            return True
    return False


def _offending_fixtures(trees: list[ast.Module]) -> set[str]:
    """Fixtures that start a cluster or run a release, or ask for one that does."""
    fixtures = []
    for tree in trees:
        names = _bound_names(tree)
        sessions = _Scan(names, tree, set(), follow=False).sessions
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _is_fixture(node):
                fixtures.append((node, tree, names, sessions))
    bad: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node, tree, names, sessions in fixtures:
            if node.name in bad:
                continue
            scan = _Scan(names, tree, bad, sessions=sessions)
            scan.visit(node)
            if scan.found:
                bad.add(node.name)
                changed = True
    return bad


def offences(source: str, conftests: tuple[str, ...] = ()) -> list[str]:
    """``line: what`` for every entry point of a cluster or a whole release in ``source``."""
    tree = ast.parse(source)
    fixtures = _offending_fixtures([*(ast.parse(c) for c in conftests), tree])
    scan = _Scan(_bound_names(tree), tree, fixtures)
    scan.visit(tree)
    return [f"line {line}: {what}" for line, what in sorted(set(scan.found))]


def _conftest_sources() -> tuple[str, ...]:
    return tuple(p.read_text() for p in CONFTESTS if p.exists())


@pytest.mark.parametrize("path", sorted(UNIT.glob("*.py")), ids=lambda p: p.name)
def test_unit_tests_start_no_cluster_and_run_no_release(path: pathlib.Path) -> None:
    found = offences(path.read_text(), _conftest_sources())
    assert not found, (
        f"tests/unit/{path.name} starts a cluster or runs a whole release; move the test "
        "to tests/system:\n  " + "\n  ".join(found)
    )


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("from distributed import LocalCluster\nLocalCluster()", "LocalCluster"),
        ("import distributed\nwith distributed.LocalCluster() as c: pass", "LocalCluster"),
        ("from dask.distributed import Client\nClient(processes=False)", "Client"),
        ("import distributed as d\nd.Client('tcp://x')", "Client"),
        ("from distributed.utils_test import gen_cluster", "test harness"),
        ("from dpdask.pipeline.cluster import connect\nconnect({})", "Client or cluster"),
        ("import dpdask\ndpdask.release(plan, store)", "dpdask.release"),
        ("from dpdask.graph import release\nrelease(p, s)", "dpdask.release"),
        ("from dpdask.graph import release as r\nr(p, s)", "dpdask.release"),
        ("from dpdask.graph import Release\nRelease.to_zarr(r, o)", "to_zarr"),
        ("from dpdask.pipeline.run import run_spec\n", "run_spec"),
        ("import dpdask.pipeline.run as pr\npr.run_spec(s)", "run_spec"),
        ("from dpdask.cli import main\nmain(['run', 'spec.yaml'])", "command line's run"),
        (
            "from dpdask.cli import main\ndef test():\n    a = ['run', 's']\n    main([*a, '-q'])",
            "command line's run",
        ),
        ("from dpdask.cli import main\ndef test(argv):\n    main(argv)", "cannot read"),
        (
            "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'dpdask.cli', 'run'])",
            "python -m",
        ),
        ("import dpdask\ndpdask.Session(ledger='l').release(spec)", "Session.release"),
        ("from dpdask import Session\ns = Session()\ns.release(x)", "Session.release"),
        ("from dpdask import Session\nwith Session() as s:\n    s.release(x)", "Session.release"),
        (
            "import pytest\nfrom distributed import Client\n@pytest.fixture\ndef client():\n"
            "    yield Client()\ndef test_a(client):\n    pass",
            "fixture 'client'",
        ),
    ],
)
def test_the_check_sees_each_entry_point(source: str, fragment: str) -> None:
    assert any(fragment in o for o in offences(source)), offences(source)


def test_an_imported_release_machine_is_seen(tmp_path, monkeypatch) -> None:
    """A class from another test module that runs releases is refused; its pure helpers
    are not."""
    folder = tmp_path / "tests" / "system"
    folder.mkdir(parents=True)
    (folder / "test_fake.py").write_text(
        "from dpdask.pipeline.run import run_spec\n"
        "class Machine:\n    def step(self):\n        run_spec(None)\n"
        "def _spec(tmp):\n    return tmp / 'spec.yaml'\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = offences("from tests.system.test_fake import Machine, _spec\n")
    assert found == ["line 1: imports Machine from tests.system.test_fake, which does"]
    assert offences("from tests.system.test_fake import _spec\n") == []


def test_a_cluster_fixture_in_conftest_is_seen() -> None:
    conftest = (
        "import pytest, distributed\n@pytest.fixture\ndef cluster():\n"
        "    with distributed.LocalCluster() as c:\n        yield c\n"
        "@pytest.fixture\ndef client(cluster):\n    return object()\n"
    )
    found = offences("def test_a(client):\n    pass\n", (conftest,))
    assert found == ["line 1: test_a uses the fixture 'client', which starts a cluster"]


@pytest.mark.parametrize(
    "source",
    [
        "from dpdask.cli import main\nmain(['plan', '--workload', 'prefix'])",
        "from dpdask.cli import main\ndef t():\n    a = ['bench', 'linalg']\n    main(a + ['x'])",
        "from dpdask.pipeline.spec import parse_spec\nparse_spec({'cluster': {'n_workers': 2}})",
        "import pytest\n@pytest.mark.parametrize('cluster', [1])\ndef test_a(cluster):\n    pass",
        "from dpdask.publish import release_attributes\nrelease_attributes(x)",
        "import xarray\nxarray.Dataset().to_zarr('o.zarr')",
        "from dpdask.privacy import Ledger\nLedger('l').open_release('r', b)",
        "def test_a(cluster):\n    pass",  # a parameter that is no fixture of a cluster
    ],
)
def test_the_check_passes_pure_code(source: str) -> None:
    assert offences(source) == []
