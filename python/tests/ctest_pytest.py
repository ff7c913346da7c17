"""pytest's tests as ctest tests, one each, with skips counted as skips.

ctest sees one exit code per test. Run as one ctest test, a pytest suite in
which some tests skip (no torch, no TensorFlow plugin) would count as one
pass. Starting pytest once per test instead would cost an interpreter, and
often a torch import (~3 s), per test. So, as doctest_discover_tests does for
the C++ tests, and with one pytest run shared:

  discover OUT SUITE=FILE... -- PYTEST_ARGS   (ctest's TEST_INCLUDE_FILES)
      collects once and writes OUT, a ctest script that registers each
      collected test of each suite (by its file's name; FILE * for the rest)
      as "SUITE: NODEID", plus each module that was skipped or failed as a
      whole at collection.
  run REPORT -- PYTEST_ARGS                   (ctest test "SUITE", a fixture)
      runs the suite once, writing each test's outcome to REPORT as it
      ends. Exits 0 once pytest ran, failures or not: the outcomes belong to
      the tests below, which a failed fixture would leave unrun.
  outcome REPORT NODEID                       (ctest test "SUITE: NODEID")
      exits 0 if NODEID passed, 77 (SKIP_RETURN_CODE) if it was skipped, 1
      if it failed or never ran, printing why.

A test collected but missing from REPORT because its module skipped as a
whole at run time (torch hidden since discovery) takes that module's skip.
"""

import json
import os
import sys

SKIP_EXIT_CODE = 77


def _split(argv):
    """Arguments before and after '--'."""
    if "--" not in argv:
        sys.exit("usage: ctest_pytest.py {discover|run|outcome} ... [-- pytest args]")
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def _bracket(text):
    """`text` as a CMake bracket argument: nothing inside needs escaping."""
    fence = "="
    while f"]{fence}]" in text:
        fence += "="
    return f"[{fence}[{text}]{fence}]"


class _Collector:
    def __init__(self):
        self.nodeids = []

    def pytest_collectreport(self, report):
        # A module skipped as a whole (importorskip at its top) or failing to
        # import has no items: it is registered itself.
        if (report.skipped or report.failed) and report.nodeid:
            self.nodeids.append(report.nodeid)

    def pytest_collection_finish(self, session):
        self.nodeids.extend(item.nodeid for item in session.items)


def discover(args, pytest_args):
    import pytest
    out, suites = args[0], args[1:]
    collector = _Collector()
    code = pytest.main(pytest_args + ["--collect-only", "-q", "-p", "no:cacheprovider"],
                       plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED,
                    pytest.ExitCode.TESTS_FAILED):
        return int(code)
    by_file = dict(suite.split("=", 1)[::-1] for suite in suites)  # file (or *) -> suite
    lines = []
    for nodeid in collector.nodeids:
        suite = by_file.get(os.path.basename(nodeid.split("::")[0]), by_file.get("*"))
        name = _bracket(f"{suite}: {nodeid}")
        lines.append(f"add_test({name} ${{MONARCH_PYTEST_OUTCOME}} ${{MONARCH_PYTEST_REPORT_{suite}}} "
                     f"{_bracket(nodeid)})")
        lines.append(f"set_tests_properties({name} PROPERTIES FIXTURES_REQUIRED {suite} "
                     f"SKIP_RETURN_CODE {SKIP_EXIT_CODE} LABELS \"${{MONARCH_PYTEST_LABELS_{suite}}}\")")
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(out + ".tmp", out)
    return 0


class _Reporter:
    def __init__(self, path):
        self.file = open(path, "w", buffering=1)

    def _write(self, nodeid, outcome, detail):
        self.file.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "detail": detail}) + "\n")

    @staticmethod
    def _detail(report):
        if report.skipped and isinstance(report.longrepr, tuple):
            return report.longrepr[2]  # (file, line, reason)
        return report.longreprtext

    def pytest_collectreport(self, report):
        if (report.skipped or report.failed) and report.nodeid:
            self._write(report.nodeid, report.outcome, self._detail(report))

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self._write(report.nodeid, report.outcome, self._detail(report))

    def pytest_sessionfinish(self):
        self.file.close()


def run(args, pytest_args):
    import pytest
    report = args[0]
    if os.path.exists(report):
        os.unlink(report)  # Never an earlier run's outcomes.
    code = pytest.main(pytest_args, plugins=[_Reporter(report)])
    if code == pytest.ExitCode.NO_TESTS_COLLECTED and os.path.getsize(report) > 0:
        return 0  # Every module skipped whole (no torch): reported as such.
    return 0 if code in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) else int(code)


def outcome(args):
    report, nodeid = args
    try:
        with open(report) as f:
            entries = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        print(f"no report of the suite's run: {e}")
        return 1
    # Its own phases (setup, call, teardown), or the module that held it.
    mine = [e for e in entries if e["nodeid"] == nodeid]
    if not mine:
        mine = [e for e in entries if nodeid.startswith(e["nodeid"] + "::")]
    if not mine:
        # A module registered whole at discovery: its tests, if it has them now.
        mine = [e for e in entries if e["nodeid"].startswith(nodeid + "::")]
    if not mine:
        print(f"{nodeid}: not in the run's report (the run stopped before it?)")
        return 1
    for wanted, code in (("failed", 1), ("passed", 0), ("skipped", SKIP_EXIT_CODE)):
        hits = [e for e in mine if e["outcome"] == wanted]
        if hits:
            for e in hits:
                print(f"{e['nodeid']}: {wanted} {e['detail']}".rstrip())
            return code
    return 1


def main(argv):
    command, rest = argv[0], argv[1:]
    if command == "outcome":
        return outcome(rest)
    args, pytest_args = _split(rest)
    if command == "discover":
        return discover(args, pytest_args)
    if command == "run":
        return run(args, pytest_args)
    sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
