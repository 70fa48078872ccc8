"""The ``stackshot`` command (also ``python -m stackshot`` and ``python -m sampler``):
profile a whole program.

``stackshot [options] script.py [args]``, ``-m module [args]`` or ``-c code [args]``,
as ``python -m cProfile`` takes them.  The program runs in this process, in the main
thread, as Python would run it: it sees its own ``sys.argv``, ``__name__ ==
'__main__'``, its directory (or the current one) first on ``sys.path``, and the
command exits with the program's own exit status.  Meanwhile a sampler snapshots
the main thread (``--all-threads``: every thread); when the program ends -- by
returning, ``sys.exit``, an exception or Ctrl-C -- the profile of what ran is saved
(``-o``) and rendered (``--format``).

The program is run from :func:`_run_program`; :func:`stackshot.toplevel.trim_snapshots`
cuts every frame outside it, so the profile starts at the program's ``<module>``.

Collecting is the ``sampler``'s work; the output half (formats, filters, writing)
comes from :mod:`analyzer.cli`, imported when the command starts, before the
program can change ``sys.path``.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import io
import os
import runpy
import signal
import sys
import threading
import traceback
import types
from typing import IO, Any, Optional, Sequence

from sampler.controller import create_sampler
from sampler.snapshot import Snapshots, merge
from sampler.tracking import ALL_THREADS

from .children import ChildCounter, ChildProfiles
from .toplevel import OtherThreads, _own_files, _runpy_files, _with_run_extra, trim_snapshots

__all__ = ["main", "Program"]

EXIT_ERROR = 1  # stackshot could not do what was asked (the program's own status wins)
EXIT_USAGE = 2  # a bad command line, a script that cannot be opened (as `python` does)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a program stopped by Ctrl-C


class UsageError(Exception):
    """A one-line problem with the command line or the program named on it."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------------
# The program
# ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Program:
    """What to run: a script (file, directory or zip), a module, or a code string."""

    kind: str  # 'script', 'module' or 'code'
    target: str  # the path, module name or code
    args: list[str]  # the program's own arguments (after the target)
    code: Optional[types.CodeType] = None  # compiled in advance for files and -c

    @property
    def argv(self) -> list[str]:
        """``sys.argv`` as Python would set it (``-m`` fixes argv[0] when it runs)."""
        first = {"script": self.target, "module": self.target, "code": "-c"}[self.kind]
        return [first, *self.args]

    @property
    def identity(self) -> str:
        """What the saved run records as its program: ``python -m analyzer`` sums only
        runs of the same one.  A file's name, not its path, so that runs from other
        checkouts and machines still add up."""
        if self.kind == "script":
            return f"script {os.path.basename(os.path.normpath(self.target))}"
        if self.kind == "module":
            return f"-m {self.target}"
        digest = hashlib.sha256(self.target.encode("utf-8", "surrogatepass")).hexdigest()
        return f"-c {digest[:12]}"

    def prepare(self) -> None:
        """Check that the program exists and compile it, before any sampling: a typo
        is a one-line error, not a profile of nothing."""
        if self.kind == "script":
            self._prepare_script()
        elif self.kind == "module":
            self._prepare_module()
        else:
            self.code = _compile(self.target.encode("utf-8", "surrogateescape"), "<string>")

    def _prepare_script(self) -> None:
        path = os.path.abspath(self.target)
        if os.path.isdir(path) or (os.path.isfile(path) and _is_zip(path)):
            if not _has_main(path):  # runpy.run_path would say so with a traceback
                raise UsageError(f"can't find '__main__' module in {path!r}", EXIT_ERROR)
            return  # runpy.run_path runs its __main__
        try:
            with io.open_code(path) as f:
                source = f.read()
        except OSError as e:
            raise UsageError(f"can't open file {path!r}: [Errno {e.errno}] {e.strerror}") from None
        self.code = _compile(source, path)

    def _prepare_module(self) -> None:
        name = self.target
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations is not None:
                if importlib.util.find_spec(name + ".__main__") is None:
                    raise UsageError(f"No module named {name}.__main__; {name!r} is a package "
                                     f"and cannot be directly executed", EXIT_ERROR)
        except UsageError:
            raise
        except (ImportError, ValueError) as e:
            raise UsageError(f"{_one_line(e)} (while looking for module {name!r})", EXIT_ERROR) from None
        except Exception as e:  # the parent package's own code failed as it was imported
            raise _ProgramError(e) from None
        if spec is None:
            raise UsageError(f"No module named {name}", EXIT_ERROR)


def _has_main(path: str) -> bool:
    """Whether a directory or zip file holds the ``__main__`` that ``python path`` runs."""
    names = ("__main__.py", "__main__.pyc")
    if os.path.isdir(path):
        return any(os.path.isfile(os.path.join(path, n)) for n in names)
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n in z.namelist() for n in names)
    except (OSError, zipfile.BadZipFile):
        return False


def _is_zip(path: str) -> bool:
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


class _ProgramError(Exception):
    """The program failed before it could be run (it does not compile, or its parent
    package raised as it was imported): Python's own report is printed, status 1."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _compile(source: bytes, filename: str) -> types.CodeType:
    try:
        return compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        if isinstance(e, SyntaxError):
            raise _ProgramError(e) from None
        raise UsageError(f"cannot compile {filename}: {e}", EXIT_ERROR) from None


def _run_program(program: Program, keep: Optional[list] = None) -> None:
    """Run the program once in a fresh ``__main__`` (the frame the profile starts after).

    ``keep``, if given, receives the program's global namespace, so that what the
    program still holds when it ends stays alive until the caller drops the list
    (``--memory``'s view of the bytes still live at the end)."""
    sys.argv[:] = program.argv
    keep = [] if keep is None else keep
    if program.kind == "module":
        keep.append(runpy.run_module(program.target, run_name="__main__", alter_sys=True))
        return
    if program.code is None:  # a directory or zip file with a __main__.py
        keep.append(runpy.run_path(program.target, run_name="__main__"))
        return
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __package__=None, __spec__=None)
    if program.kind == "script":  # -c code has no file, as under `python -c`
        filename = program.code.co_filename
        loader = importlib.machinery.SourceFileLoader("__main__", filename)
        module.__dict__.update(__file__=filename, __cached__=None, __loader__=loader)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    keep.append(module.__dict__)
    try:
        exec(program.code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _set_path(program: Program) -> None:
    """``sys.path[0]`` as Python sets it: the script's directory, or the current one."""
    if program.kind == "script":
        path = os.path.abspath(program.target)
        first = path if program.code is None else os.path.dirname(os.path.realpath(path))
    elif program.kind == "module":
        first = os.getcwd()
    else:
        first = ""
    if sys.path:
        sys.path[0] = first
    else:
        sys.path.append(first)


# ----------------------------------------------------------------------------------
# Running it under the sampler
# ----------------------------------------------------------------------------------
def _launcher_files() -> frozenset[str]:
    """Files whose frames are stackshot's, not the program's: left out of tracebacks."""
    return (_own_files() | _runpy_files()
            | {_run_program.__code__.co_filename, __file__,
               importlib.util.find_spec.__code__.co_filename})  # "<frozen importlib.util>"


def _print_program_error(exc: BaseException, ours: frozenset[str]) -> None:
    """Print the program's exception as Python would, without stackshot's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    try:
        sys.stdout.flush()  # what the program printed comes before its traceback
    except (OSError, ValueError, AttributeError):
        pass
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()


def _exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit(code)`` asks for, printing a non-integer code as Python does."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _wait_for_threads() -> None:
    """Wait for the program's non-daemon threads, as the interpreter does before it
    exits: their work belongs in the profile."""
    me, main = threading.current_thread(), threading.main_thread()
    while True:
        pending = [t for t in threading.enumerate()
                   if t is not me and t is not main and not t.daemon and t.is_alive()]
        if not pending:
            return
        for t in pending:
            t.join()


@dataclasses.dataclass
class Outcome:
    """How the program ended: its exit status, and the exception that ended it."""

    status: int = 0
    interrupted: bool = False
    error: Optional[BaseException] = None
    kept: list = dataclasses.field(default_factory=list)  # the program's globals, see _run_program


def _run(program: Program, repeat: int) -> Outcome:
    """Run the program ``repeat`` times; a failure or non-zero exit stops the repeats.

    The exception that ended the program is returned, not printed: printing it is
    stackshot's work, done after the sampler stops so that it is not profiled.
    """
    out = Outcome()
    try:
        for _ in range(repeat):
            try:
                _run_program(program, out.kept)
            except SystemExit as e:
                out.status = _exit_status(e)
                if out.status:
                    break
        _wait_for_threads()
    except KeyboardInterrupt as e:
        out.status, out.interrupted, out.error = EXIT_INTERRUPTED, True, e
    except BaseException as e:  # the program's own failure: Python's report, status 1
        out.status, out.error = 1, e
        try:
            _wait_for_threads()
        except KeyboardInterrupt:
            out.interrupted = True
    return out


class _SigintDeferred:
    """While the profile is written, a second Ctrl-C must not lose it: SIGINT is
    ignored for that short time (only the main thread may change handlers)."""

    def __enter__(self) -> None:
        self.saved = None
        if threading.current_thread() is threading.main_thread():
            self.saved = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            signal.signal(signal.SIGINT, self.saved)


# ----------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------
def _delay(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {text}")
    return value


def _repeat(text: str) -> int:
    from analyzer.cli import whole_number_argument

    return whole_number_argument(text, 1)


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    from analyzer.cli import REPORT_FORMATS, add_output_arguments

    parser = argparse.ArgumentParser(
        prog=prog or "stackshot", allow_abbrev=False,
        usage="%(prog)s [options] (script.py | -m module | -c code) [args ...]",
        description="Run a Python program under stackshot's sampler. The profile never "
                    "shares standard output with the program: the report (Racket's "
                    "caller/callee text by default) is printed on standard error after "
                    "the program ends, and -o FILE writes the format FILE's name says.",
        epilog="Options after the script, module or code are the program's own. The command "
               "exits with the program's exit status (130 after Ctrl-C, which stops the "
               "program and still writes the profile); 1 or 2 when stackshot itself cannot "
               "do what was asked. Percentages may be written 1, 1% or 0.5. -o endings: "
               + ", ".join(f"{e} ({f})" for e, f in _file_endings()) + ".")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER,
                        help="-m module [args ...]: run a library module as a script, "
                             "like python -m")
    parser.add_argument("-c", dest="code", nargs=argparse.REMAINDER,
                        help="-c code [args ...]: run a program passed as a string, "
                             "like python -c")
    parser.add_argument("--delay", type=_delay, default=0.001, metavar="SECONDS",
                        help="seconds between samples, the sampling period (default: 0.001)")
    parser.add_argument("--repeat", type=_repeat, default=1, metavar="N",
                        help="run the program N times, profiled as one (default: 1)")
    parser.add_argument("--all-threads", action="store_true",
                        help="sample every thread of the process, not only the main thread")
    parser.add_argument("--subprocesses", action="store_true",
                        help="profile the program's child processes that run Python too "
                             "(os.fork, multiprocessing's fork, spawn and forkserver, subprocess), "
                             "merged into one profile with each child's threads named by pid")
    parser.add_argument("--use-errortrace", action="store_true",
                        help="sample an instrumented stack that also sees C functions")
    parser.add_argument("--engine", choices=("native", "python"), default=None,
                        help="which engine reads the stacks (default: the sampler's choice)")
    parser.add_argument("-o", "--output", metavar="FILE", action="append", default=[],
                        help="write the profile to FILE, in the format its name ends with "
                             "(.stackshot keeps the snapshots for `python -m analyzer`); "
                             "repeatable. Nothing is printed then unless --format is given")
    parser.add_argument("--memory", metavar="RATE", default=None,
                        help="profile allocations instead of time (sampler.memprof): each "
                             "allocated word is sampled with probability RATE, 0 < RATE <= 1 "
                             "(1e-4 costs no visible time, 1e-3 a few percent); every thread is "
                             "sampled, and the report is in estimated bytes: allocated, or still "
                             "live at the end with --weight wall")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                        help=argparse.SUPPRESS)
    add_output_arguments(
        parser, selection=True, render_to=False,
        format_help="the report printed on standard error after the program: "
                    + ", ".join(REPORT_FORMATS) + " (default: text, unless -o is given); "
                    "other formats are files for other programs: use -o FILE")
    return parser


def _file_endings() -> tuple:
    from analyzer.cli import FILE_ENDINGS

    return FILE_ENDINGS


def _program_from(args: argparse.Namespace) -> Program:
    script = list(args.program or [])
    if script[:1] == ["--"]:  # `stackshot [options] -- script.py`: the end of our options
        script = script[1:]
    given = [(k, v) for k, v in (("module", args.module), ("code", args.code),
                                 ("script", script)) if v]
    if args.module is not None and not args.module:
        raise UsageError("argument -m: expected a module name")
    if args.code is not None and not args.code:
        raise UsageError("argument -c: expected the code to run")
    if not given:
        raise UsageError("no program given: name a script, -m module or -c code")
    kind, words = given[0]
    return Program(kind, words[0], list(words[1:]))


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    The order matters: everything that can be checked is checked before the program
    starts; the sampler stops as soon as the program ends, so that reporting its
    error and writing the profile are not profiled; the profile is written even when
    the program failed; a process forked by the program never writes or prints it.
    """
    from analyzer.cli import CLIError, OutputOptions
    importlib.import_module("sampler.snapshot_file")  # loaded before the program owns sys.path

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    report = _ReportStream()  # the profile goes where a user sees it, whatever the program does
    # frames that are stackshot's: its modules, runpy, and the command's own __main__
    # (sampler/__main__.py, stackshot/__main__.py, or the `stackshot` console script)
    launcher = _launcher_files() | {f for f in [getattr(sys.modules.get("__main__"), "__file__", None)] if f}
    try:
        program = _program_from(args)
        opts = OutputOptions.from_namespace(args)
        files = [(path, dataclasses.replace(opts, format_given=False).for_file(path))
                 for path in args.output]
        shown = _report_options(opts, args)
        rate = _memory_rate(args)
        program.prepare()
    except (UsageError, CLIError) as e:
        _fail(str(e))
        return e.status
    except _ProgramError as e:
        _print_program_error(e.error, launcher)
        return 1

    _set_path(program)
    track = ALL_THREADS if args.all_threads else threading.current_thread()
    engine = {} if args.engine is None else {"engine": args.engine}  # only when asked for
    try:
        sampler = _memory_sampler(rate) if rate is not None else \
            create_sampler(track, args.delay, use_errortrace=args.use_errortrace, **engine)
    except _MemprofUnavailable as e:
        _fail(f"--memory: {e}")
        return EXIT_ERROR
    except (NotImplementedError, RuntimeError) as e:  # e.g. another profiler holds the hook
        if not args.use_errortrace:
            raise
        _fail(f"--use-errortrace: {_one_line(e)}")
        return EXIT_USAGE
    except (TypeError, ValueError) as e:
        if not engine:
            raise
        _fail(f"--engine {args.engine}: {_one_line(e)}")
        return EXIT_USAGE
    def trim(snaps: Snapshots) -> Snapshots:
        return trim_snapshots(snaps, (_run_program,), overhead=(main,), own_files=launcher)

    forks = ChildProfiles(args.delay, args.all_threads) if args.subprocesses else None
    children = ChildCounter()
    others = OtherThreads(() if args.all_threads or args.use_errortrace else [track])
    parent = os.getpid()
    try:
        with children, (others if not args.all_threads and not args.use_errortrace and rate is None
                        else contextlib.nullcontext()), (forks or contextlib.nullcontext()):
            outcome = _run(program, args.repeat)
    finally:
        if os.getpid() == parent:
            with _SigintDeferred():
                sampler.stop()
    outcome.kept.clear()  # the program's globals lived until the sampler stopped
    if os.getpid() != parent:
        # A process the program forked, leaving the program's code: the profile is the
        # parent's to write; this one has no sampler thread and must not overwrite it
        # (with --subprocesses it leaves its own snapshots for the parent to merge, at exit).
        if outcome.error is not None:
            _print_program_error(outcome.error, launcher)
        return outcome.status
    if outcome.error is not None:
        _print_program_error(outcome.error, launcher)
    with _SigintDeferred():
        snapshots = trim(sampler.get_snapshots())
        kids = forks.collect(trim) if forks is not None else []
        snapshots = _with_run_extra(snapshots, {
            "program": program.identity, "argv": list(program.argv),
            "exit_status": outcome.status, "interrupted": outcome.interrupted,
            **children.extra(profiled=len(kids)), **others.extra(),
        })
        snapshots = merge(snapshots, *kids) if kids else snapshots
        status = _write(snapshots, files, shown, report)
        if outcome.interrupted:
            _fail("interrupted; the profile covers the program until then")
    return outcome.status or status


class _MemprofUnavailable(Exception):
    """``--memory`` was asked for where the memprof engine is not built."""


def _memory_rate(args: argparse.Namespace) -> Optional[float]:
    """``--memory RATE`` as a probability, checked before the program runs; ``None``
    without ``--memory``.  Options that choose a stack sampler do not combine with it."""
    if args.memory is None:
        return None
    try:
        rate = float(args.memory)
    except ValueError:
        raise UsageError(f"--memory: not a sampling rate: {args.memory!r} (a probability, "
                         f"such as 1e-4)") from None
    if not 0.0 < rate <= 1.0:
        raise UsageError(f"--memory: the sampling rate is a probability per word, "
                         f"0 < RATE <= 1, not {args.memory}")
    for flag, on in (("--use-errortrace", args.use_errortrace), ("--engine", args.engine),
                     ("--subprocesses", args.subprocesses)):
        if on:
            raise UsageError(f"--memory samples allocations, not stacks over time: "
                             f"{flag} does not apply to it")
    return rate


def _memory_sampler(rate: float) -> Any:
    """A started :class:`sampler.memprof.Recorder` (``stop`` and ``get_snapshots``
    as a sampler has); :class:`_MemprofUnavailable` where the engine is not built."""
    from sampler import memprof

    if memprof._memprof is None:
        raise _MemprofUnavailable(memprof._UNAVAILABLE)
    return memprof.Recorder(rate)


def _report_options(opts: Any, args: argparse.Namespace) -> Optional[Any]:
    """The options of the report printed after the program, or ``None`` for none:
    text unless ``-o`` is given; ``--format`` names a report, never a machine format,
    which would mix into what the user reads (it goes to a file with ``-o``)."""
    from analyzer.cli import REPORT_FORMATS

    if args.format is None:
        return None if args.output else opts
    if args.format not in REPORT_FORMATS:
        ending = next((e for e, f in _file_endings() if f == args.format), "")
        raise UsageError(f"--format {args.format} is a file for another program, not a "
                         f"report to read: write it with -o FILE (e.g. -o profile{ending})")
    return opts


class _ReportStream:
    """Standard error as it was when stackshot started, kept on a duplicate of its
    file descriptor: the report still reaches the user when the program closed or
    replaced ``sys.stderr`` (or ``sys.stdout``, which it never uses)."""

    def __init__(self) -> None:
        self.stream: Any = sys.stderr
        try:
            fd = os.dup(sys.stderr.fileno())
        except (OSError, ValueError, AttributeError):
            return
        encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
        self.stream = open(fd, "w", encoding=encoding, errors="backslashreplace",
                           closefd=True)

    def write(self, text: str) -> int:
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


def _write(snapshots: Snapshots, files: list, report_opts: Any, report: Any) -> int:
    """Write the snapshots to each ``(path, options)`` of ``files`` and print the
    report with ``report_opts`` (if any) on ``report``; returns 0, or the status of
    stackshot's own failure, told in one line."""
    from analyzer.cli import CLIError, write_output

    for stream in (sys.stdout, sys.stderr):  # the program's output comes first
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    status = 0
    for path, file_opts in files:
        try:
            write_output(snapshots, file_opts)
        except CLIError as e:
            _fail(str(e))
            status = status or e.status
    if report_opts is not None:
        try:
            write_output(snapshots, report_opts, report)
        except CLIError as e:
            _fail(str(e))
            status = status or e.status
        except BrokenPipeError:  # `stackshot prog.py 2>&1 | head`: not worth a message
            _silence(report)
    return status


def _fail(message: str) -> None:
    print(f"stackshot: {message}", file=sys.stderr)


def _silence(stream: IO[str]) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
