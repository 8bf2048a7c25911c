"""The docs tell the truth: every code block in README.md and docs/*.md runs or is checked.

A fenced block is one of (the rule is in README.md, "Writing docs"):

- ``python``: executed here, a page's blocks in order in one namespace, on the local
  executor (``CHANDY_CONFIG`` sets ``execution.target: local``, so an example written for
  Spark runs as threads);
- ``bash`` / ``sh``, and the ``$ `` lines of ``console``: every command is checked — the
  ``chandy`` subcommands and options exist, ``python -m MODULE`` names a module (and its
  options appear in its ``--help``), a file of this repository named on the line exists,
  and any other program is one the docs are known to use;
- ``yaml``: chandy's configuration, every key known and every value valid;
- anything else, or a block of the above that cannot run here (it needs a broker, a
  cluster, a stream the page built before), is marked on the line before the fence with
  ``<!-- fragment -->`` (code that is not run) or ``<!-- output -->`` (what something
  prints); either may give a reason after a colon.

No page names an issue number either: the docs speak to users, who never saw the tracker.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Where an issue number would leak: every page users read, the benchmark pages included.
READ_BY_USERS = [*PAGES, *sorted((ROOT / "bench").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>fragment|output)\b(?::[^>]*?)?\s*-->\s*$")
_ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+|(?<![\w/&#])#\d+\b")

#: Programs the shell blocks may call besides ``chandy`` and ``python``: each is the
#: documented way to do something chandy does not do itself.
KNOWN_PROGRAMS = {
    "./setup.sh",
    ".venv/bin/python",
    "curl",
    "echo",
    "export",
    "grep",
    "mv",
    "pip",
    "spark-submit",
    "zip",
    "$FLINK_HOME/bin/flink",
    "env/bin/pip",
    "env/bin/venv-pack",
    "mkdocs",
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str
    marker: str | None
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of a page, dedented to their fence (blocks inside list items are)."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        assert end < len(lines), f"{page.relative_to(ROOT)}:{i + 1}: the code block is never closed"
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        code = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        )
        yield Block(page, i + 1, opening["info"].strip(), marker["kind"] if marker else None, code + "\n")
        i = end + 1


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
UNMARKED = [block for block in ALL_BLOCKS if block.marker is None]
PYTHON = [b for b in UNMARKED if b.language == "python"]
SHELL = [b for b in UNMARKED if b.language in ("bash", "sh", "console")]
YAML = [b for b in UNMARKED if b.language == "yaml"]


def test_every_code_block_runs_is_checked_or_is_marked() -> None:
    """A block of a language the suite cannot check (output, a directory tree, a usage line)
    must say what it is, so that a new example is run by default and not forgotten."""
    unchecked = [
        f"{b.id}: a ```{b.info or '(no language)'} block"
        for b in UNMARKED
        if b.language not in ("python", "bash", "sh", "console", "yaml")
    ]
    assert not unchecked, (
        "these code blocks are neither run nor checked: mark each on the line before its fence "
        "with <!-- output --> (what something prints) or <!-- fragment --> (code that is not run), "
        "or give it a language the suite checks (python, bash, console, yaml):\n" + "\n".join(unchecked)
    )
    assert len(PYTHON) >= 10  # the parser found the examples (a broken regex would pass vacuously)


def test_no_page_names_an_issue_number() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for page in READ_BY_USERS
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in _ISSUE.finditer(line)
    ]
    assert not found, "the docs speak to users, who never saw the issue tracker; say what changed:\n" + (
        "\n".join(found)
    )


def test_the_issue_number_check_finds_what_it_should() -> None:
    assert _ISSUE.search("since issue 13, snapshots")
    assert _ISSUE.search("(Issue 26 §1)")
    assert _ISSUE.search("fixed in #42.")
    assert not _ISSUE.search("[restore](restore.md#what-is-refused) and C# 10 and `&#8212;`")


@pytest.fixture
def local_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every environment an example makes runs on the local executor, on a free REST port, in
    a directory of its own (an example may write files)."""
    base = json.loads(os.environ.get("CHANDY_CONFIG") or "{}")
    monkeypatch.setenv("CHANDY_CONFIG", json.dumps({**base, "execution.target": "local", "rest.port": 0}))
    monkeypatch.chdir(tmp_path)
    yield tmp_path


PYTHON_PAGES = sorted({b.page for b in PYTHON})


@pytest.mark.timeout(120)  # an example that runs until stopped (unmarked by mistake) fails, not hangs
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[str(p.relative_to(ROOT)) for p in PYTHON_PAGES])
def test_python_examples_run(page: Path, local_jobs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A page's examples run in order in one namespace, as a reader would type them: a later
    block may use what an earlier one defined. The namespace is a module of its own (not
    importable, so cloudpickle ships its functions by value, as it does a job script's)."""
    namespace = {"__name__": "docs_example", "__file__": str(local_jobs / "example.py")}
    for block in (b for b in PYTHON if b.page == page):
        code = compile(block.code, f"{block.id} (the example)", "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(
                f"{block.id}: the example fails ({type(exc).__name__}: {exc}). Fix it, or, when it "
                "cannot run here (it needs a broker, a cluster, or something the page does not "
                "define), mark it with <!-- fragment --> on the line before its fence"
            ) from exc
    capsys.readouterr()


def _shell_commands(block: Block) -> Iterator[list[str]]:
    """Each command of a shell block as words: comments dropped, continuations joined, ``$ ``
    prompts of a console block taken (their output lines are not commands)."""
    lines = block.code.splitlines()
    if block.language == "console":
        joined, taking = [], False
        for line in lines:
            if line.startswith("$ "):
                joined.append(line[2:])
                taking = line.endswith("\\")
            elif taking:
                joined.append(line)
                taking = line.endswith("\\")
        lines = joined
    text = "\n".join(lines).replace("\\\n", " ")
    for line in text.splitlines():
        for command in re.split(r"&&|\|", line):
            words = shlex.split(command, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value program ...
                words = words[1:]
            if words:
                yield words


def _check_chandy(words: list[str]) -> None:
    from chandy.cli.main import cli

    command: click.Command = cli
    args = words[1:]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(click.Context(command), args[0])
        assert sub is not None, f"`chandy` has no subcommand {args[0]!r} ({' '.join(words)})"
        command, args = sub, args[1:]
    options = {opt: param for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    passes_on = bool(command.context_settings.get("ignore_unknown_options"))  # run: the job's own
    positional = False
    words_left = iter(args)
    for word in words_left:
        if word == "--":
            break
        if not word.startswith("-") or len(word) == 1:
            positional = True  # after the job file, options chandy does not know are the job's
            continue
        option = word.split("=", 1)[0]
        param = options.get(option)
        if param is None:
            assert option in ("-h", "--help") or (passes_on and positional), (
                f"`{' '.join(words)}`: {command.name} has no option {option}"
            )
            continue
        if isinstance(param, click.Option) and not param.is_flag and "=" not in word:
            next(words_left, None)  # its value


@cache
def _help_of(module: str, subcommand: str | None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *([subcommand] if subcommand else []), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, f"python -m {module} --help fails: {done.stderr[-2000:]}"
    return done.stdout


def _check_python(words: list[str]) -> None:
    if words[1:2] != ["-m"]:  # python FILE: the file is the user's own (my_job.py) or ours
        path = words[1]
        if "/" in path:
            assert (ROOT / path).exists(), f"`{' '.join(words)}`: no file {path} in the repository"
        return
    module = words[2]
    with contextlib.suppress(ModuleNotFoundError):
        if importlib.util.find_spec(module) is not None:
            break_at = module in ("pytest", "venv", "pip")  # not ours: existing is enough
            if break_at:
                return
            args = words[3:]
            subcommand = args[0] if args and not args[0].startswith("-") else None
            help_text = _help_of(module, subcommand)
            for word in args:
                if word.startswith("--"):
                    option = word.split("=", 1)[0]
                    assert option in help_text, f"`{' '.join(words)}`: {option} is not in its --help"
            return
    raise AssertionError(f"`{' '.join(words)}`: there is no module {module}")


@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell_commands_exist(block: Block) -> None:
    for words in _shell_commands(block):
        program = words[0]
        if program == "chandy":
            _check_chandy(words)
        elif program in ("python", ".venv/bin/python"):
            _check_python(words)
        else:
            assert program in KNOWN_PROGRAMS, (
                f"{block.id}: `{' '.join(words)}` calls {program!r}, which the docs are not known to "
                "use: add it to KNOWN_PROGRAMS in tests/test_docs.py if it is right, or mark the block "
                "<!-- fragment -->"
            )
        for word in words[1:]:  # a file of this repository that a command names exists
            if re.fullmatch(r"(examples|tests|bench|docs|chaos)/[\w./-]+\.\w+", word):
                assert (ROOT / word).exists(), f"{block.id}: `{' '.join(words)}` names a missing file {word}"


@pytest.mark.parametrize("block", YAML, ids=[b.id for b in YAML])
def test_yaml_settings_are_chandy_settings(block: Block, tmp_path: Path) -> None:
    """A configuration file in the docs is one chandy accepts: the keys a job rejects as
    unknown, and values that do not parse, fail here first."""
    from chandy import StreamExecutionEnvironment
    from chandy.common import Configuration

    (tmp_path / "config.yaml").write_text(block.code)
    env = StreamExecutionEnvironment.get_execution_environment(
        Configuration.from_file(tmp_path / "config.yaml"), executor="local"
    )
    env._validated_config()


_SETTING_ROW = re.compile(r"^\|\s*`(?P<key>[a-z$][\w.$-]+)`\s*\|(?P<default>[^|]*)\|")
#: How a table says an option has no default value.
_NO_DEFAULT = {"", "none", "off", "not set", "—", "-"}


def test_settings_tables_state_the_defaults_chandy_has() -> None:
    """A row ``| `key` | default | ... |`` of a settings table gives the option's real
    default: parsed as chandy parses the key (``10 min``, ``20 kb``, ``'600'``), it equals
    what the code falls back to. A cell that is a description, not a value, is left alone."""
    from chandy.config.options import all_options

    options = {option.key: option for option in all_options()}
    wrong, compared = [], 0
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            row = _SETTING_ROW.match(line)
            if row is None or row["key"] not in options:
                continue
            option, cell = options[row["key"]], row["default"].strip().strip("`").strip("'")
            if cell.lower() in _NO_DEFAULT:
                value: object = None
            else:
                try:
                    value = option.parse(cell)
                    if option.check is not None:
                        option.check(value)
                except ValueError:
                    continue  # "fixed-delay with checkpointing": prose, not a value
                if isinstance(value, str) and " " in value:
                    continue  # "the bind address": a string key's cell that describes, not a value
            compared += 1
            if value != option.default and not (value is None and not option.default):
                where = f"{page.relative_to(ROOT)}:{number}"
                wrong.append(f"{where}: {row['key']} says {cell!r}, the code has {option.default!r}")
    assert not wrong, "settings tables that do not state the default the code has:\n" + "\n".join(wrong)
    assert compared >= 30  # the tables were found


def test_the_block_parser_sees_markers_languages_and_indented_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text\n\n```python\nx = 1\n```\n\n<!-- fragment: needs a stream -->\n```python\nstream.print()\n```\n"
        "\n- item:\n\n  ```bash\n  chandy list\n  ```\n\n<!-- output -->\n```\nhello\n```\n"
    )
    found = [(b.line, b.language, b.marker, b.code) for b in blocks(page)]
    assert found == [
        (3, "python", None, "x = 1\n"),
        (8, "python", "fragment", "stream.print()\n"),
        (14, "bash", None, "chandy list\n"),
        (19, "", "output", "hello\n"),
    ]
    console = Block(
        page, 1, "console", None, "$ chandy run -p 2 \\\n      -D a=b job.py\nJob has been submitted\n"
    )
    assert list(_shell_commands(console)) == [["chandy", "run", "-p", "2", "-D", "a=b", "job.py"]]


_INLINE_CHANDY = re.compile(r"`(chandy (?:run|list|savepoint|stop|cancel|checkpoint)\b[^`|]*)`")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_chandy_commands_named_in_the_text_exist(page: Path) -> None:
    """``chandy stop --drain`` in a sentence is checked as a code block's command is."""
    for match in _INLINE_CHANDY.finditer(page.read_text()):
        _check_chandy(shlex.split(match.group(1)))


def test_the_chandy_check_refuses_what_does_not_exist() -> None:
    _check_chandy(["chandy", "checkpoint", "inspect", "PATH"])
    _check_chandy(["chandy", "stop", "--savepoint-path", "/x", "JOBID"])
    with pytest.raises(AssertionError, match="no subcommand 'inspect'"):
        _check_chandy(["chandy", "inspect", "PATH"])
    with pytest.raises(AssertionError, match="no option --no-such-flag"):
        _check_chandy(["chandy", "run", "--no-such-flag", "job.py"])
    with pytest.raises(AssertionError, match="no subcommand 'checkpoints'"):
        _check_chandy(["chandy", "checkpoints", "list", "DIR"])
    _check_chandy(["chandy", "run", "-p", "2", "job.py", "--input", "x"])  # --input is the job's
    with pytest.raises(AssertionError, match="no option --drain"):
        _check_chandy(["chandy", "cancel", "--drain", "JOBID"])
