#!/usr/bin/env python3
"""Run rdma-core's tests/ suite exactly as its run_tests.py does, and record
each test's outcome as it happens, so that a crash or a hang still leaves the
results of the tests before it and names the test it happened in.

    driver.py run TESTS_DIR JSONL [--exclude-file F] [--only ID] [--per-test-timeout S] -- <run_tests.py args>
    driver.py report JSONL [--markdown]

`run` loads TESTS_DIR/__init__.py as the module `tests` with
SourceFileLoader, parses the arguments with the suite's own args_parser and
collects the tests with unittest's loader (what run_tests.py does through
unittest.main(module=tests)), then runs them with unittest's verbose text
runner.  Besides the usual output it appends one JSON object a line to JSONL:
{"start": id} before a test and {"id", "outcome", "detail"} after it, flushed
at once.  A test that runs longer than --per-test-timeout seconds is stopped
by faulthandler (all threads' Python stacks go to stderr, exit status 1).
Tests whose ids are listed in --exclude-file (one a line) are not run.
"""
import faulthandler
import json
import os
import sys
import unittest


def _run(argv):
    tests_dir = os.path.abspath(argv[0])
    jsonl = argv[1]
    rest = argv[2:]
    exclude = set()
    only = None
    per_test_timeout = 0
    while rest and rest[0] != '--':
        opt = rest.pop(0)
        if opt == '--exclude-file':
            with open(rest.pop(0)) as f:
                exclude = {ln.strip() for ln in f if ln.strip()}
        elif opt == '--only':
            only = rest.pop(0)
        elif opt == '--per-test-timeout':
            per_test_timeout = float(rest.pop(0))
        else:
            sys.exit(f'driver.py: unknown option {opt}')
    if rest:
        rest.pop(0)

    # As run_tests.py: the tests directory is sys.path[0] (args_parser is
    # imported by its bare name), and __init__.py is loaded as `tests`.
    sys.path.insert(0, tests_dir)
    sys.argv = [os.path.join(tests_dir, 'run_tests.py')] + rest
    out = open(jsonl, 'a', buffering=1)

    def log(obj):
        out.write(json.dumps(obj) + '\n')
        out.flush()
        os.fsync(out.fileno())

    faulthandler.enable()
    try:
        from args_parser import parser
        from importlib.machinery import SourceFileLoader
        tests = SourceFileLoader(
            'tests', os.path.join(tests_dir, '__init__.py')).load_module()
    except BaseException:
        import traceback
        detail = traceback.format_exc()
        sys.stderr.write(detail)
        log({'load_error': detail})
        return 3
    parser.parse_args()
    # What is left in sys.argv[1:] are unittest.main's own options
    # (--verbose, -k PATTERN ...); take -k patterns as unittest.main would.
    loader = unittest.TestLoader()
    args = sys.argv[1:]
    patterns = []
    i = 0
    while i < len(args):
        if args[i] == '-k' and i + 1 < len(args):
            p = args[i + 1]
            patterns.append(p if '*' in p else f'*{p}*')
            i += 2
        else:
            i += 1
    if patterns:
        loader.testNamePatterns = patterns
    suite = loader.loadTestsFromModule(tests)

    def flatten(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from flatten(t)
            else:
                yield t

    # unittest keeps class and module fixtures per suite; rebuild a flat
    # suite in the same order without the excluded tests.
    kept = unittest.TestSuite(t for t in flatten(suite) if t.id() not in exclude
                              and (only is None or t.id() == only))

    class Result(unittest.TextTestResult):
        def startTest(self, test):
            log({'start': test.id()})
            if per_test_timeout:
                faulthandler.dump_traceback_later(per_test_timeout, exit=True)
            super().startTest(test)

        def stopTest(self, test):
            if per_test_timeout:
                faulthandler.cancel_dump_traceback_later()
            super().stopTest(test)

        def _rec(self, test, outcome, detail=''):
            log({'id': test.id(), 'outcome': outcome, 'detail': detail})

        def addSuccess(self, test):
            super().addSuccess(test)
            self._rec(test, 'pass')

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._rec(test, 'fail', self.failures[-1][1])

        def addError(self, test, err):
            super().addError(test, err)
            # errors in setUpClass/tearDownModule come as _ErrorHolder
            self._rec(test, 'error', self.errors[-1][1])

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._rec(test, 'skip', reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._rec(test, 'xfail', self.expectedFailures[-1][1])

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._rec(test, 'fail', 'unexpected success')

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                kind = 'fail' if issubclass(err[0], test.failureException) else 'error'
                self._rec(subtest, kind, self._exc_info_to_string(err, test))

    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result)
    res = runner.run(kept)
    log({'finished': True, 'ran': res.testsRun})
    return 0 if res.wasSuccessful() else 1


def reason_of(detail):
    """The exception line of a traceback (the last line that is not blank)."""
    lines = [ln for ln in detail.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ''


def _load(jsonl):
    """Final outcome per test id, in the order tests started."""
    order, res = [], {}
    load_errors = []
    started = None
    with open(jsonl) as f:
        for ln in f:
            ln = ln.strip()
            if not ln:
                continue
            try:
                o = json.loads(ln)
            except ValueError:
                continue
            if 'start' in o:
                started = o['start']
                if started not in res:
                    order.append(started)
                    res[started] = None
            elif 'id' in o:
                tid = o['id']
                if tid not in res:
                    order.append(tid)
                    res[tid] = None
                prev = res[tid]
                # a test that passed its body but errored in tearDown is
                # reported twice by unittest; keep the worse outcome
                if prev is None or prev[0] in ('pass', 'skip'):
                    res[tid] = (o['outcome'], o.get('detail', ''))
            elif 'load_error' in o:
                load_errors.append(o['load_error'])
            elif 'aborted' in o:
                tid = o['aborted']
                if tid not in res:
                    order.append(tid)
                res[tid] = (o['outcome'], o.get('detail', ''))
    return order, res, load_errors


def _report(argv):
    jsonl = argv[0]
    markdown = '--markdown' in argv
    order, res, load_errors = _load(jsonl)
    if '--causes' in argv:
        causes = {}
        for tid in order:
            oc, detail = res[tid] if res[tid] else ('unfinished', '')
            if oc in ('pass', 'skip'):
                continue
            r = detail if oc in ('crash', 'hung') else reason_of(detail)
            causes.setdefault((oc, r), []).append(tid)
        for (oc, r), tids in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print(f'{len(tids):4} {oc:5} {r}')
        for le in load_errors:
            print('the suite did not load: ' + reason_of(le))
        return 0
    for le in load_errors:
        print('the suite did not load: ' + reason_of(le))
    counts = {}
    for tid in order:
        oc = res[tid][0] if res[tid] else 'unfinished'
        counts[oc] = counts.get(oc, 0) + 1
    ran = sum(v for k, v in counts.items())
    print(f"ran {ran}: " + ', '.join(f'{k} {counts.get(k, 0)}' for k in
          ('pass', 'fail', 'error', 'skip', 'crash', 'hung', 'xfail',
           'unfinished') if counts.get(k, 0) or k in ('pass', 'fail', 'error', 'skip')))
    # plain closing line
    print(f"{counts.get('pass', 0)} passed, "
          f"{counts.get('fail', 0) + counts.get('error', 0) + counts.get('crash', 0) + counts.get('hung', 0)} failed, "
          f"{counts.get('skip', 0)} skipped")
    if markdown:
        print()
        print('| # | test | outcome | reason |')
        print('|---|---|---|---|')
        for n, tid in enumerate(order, 1):
            oc, detail = res[tid] if res[tid] else ('unfinished', '')
            reason = detail if oc == 'skip' else (
                reason_of(detail) if oc in ('fail', 'error', 'xfail') else detail)
            reason = reason.replace('|', '\\|').replace('\n', ' ')
            print(f'| {n} | {tid} | {oc} | {reason} |')
    else:
        for tid in order:
            oc, detail = res[tid] if res[tid] else ('unfinished', '')
            if oc in ('pass',):
                continue
            reason = detail if oc in ('skip', 'crash', 'hung') else reason_of(detail)
            print(f'{oc:6} {tid}: {reason}')


if __name__ == '__main__':
    if len(sys.argv) < 3 or sys.argv[1] not in ('run', 'report'):
        sys.exit(__doc__)
    if sys.argv[1] == 'run':
        sys.exit(_run(sys.argv[2:]))
    sys.exit(_report(sys.argv[2:]))
