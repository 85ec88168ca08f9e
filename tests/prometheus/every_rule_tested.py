#!/usr/bin/env python3
"""Every alert of a rules file has a `promtool test rules` case that expects
it to fire (an exp_alerts list that is not empty), so no rule ships untested.

usage: every_rule_tested.py RULES.yaml TESTS.yaml
"""
import re
import sys


def main():
    rules = open(sys.argv[1]).read()
    tests = open(sys.argv[2]).read()
    alerts = re.findall(r"^\s*- alert:\s*(\S+)", rules, re.M)
    fired = set()
    for case in re.split(r"^\s*- eval_time:", tests, flags=re.M)[1:]:
        name = re.search(r"alertname:\s*(\S+)", case)
        if name and re.search(r"exp_alerts:\s*\n\s*- exp_labels:", case):
            fired.add(name.group(1))
    missing = [a for a in alerts if a not in fired]
    if not alerts:
        print("no alert in %s" % sys.argv[1])
        return 1
    if missing:
        print("alerts without a case that fires them: " + ", ".join(missing))
        return 1
    print("%d alerts, each with a firing case" % len(alerts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
