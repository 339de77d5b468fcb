#!/usr/bin/env python3
"""Instructions per call of a function in a callgrind profile.

    valgrind --tool=callgrind --callgrind-out-file=OUT BENCH --quick --cell mem:256
    scripts/callgrind-per-call.py OUT 'Runner<E>::turn::{{closure}}' ['Runner<E>::encode' ...]

For each name (a substring of the demangled function name), prints how many times its
callers called it, the instructions of those calls (the callee's inclusive cost, its
recursive calls counted once) and their quotient. docs/BENCHMARKS.md gives its figures
per poll of `Runner::turn`, per record encoded, per procedure restarted; the wall clock
of this machine moves by 30 % between runs, instruction counts do not.
"""

import re
import sys


def per_call(path, target):
    names = {}

    def resolve(spec):
        match = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not match:
            return spec
        number, name = match.groups()
        if name:
            names[number] = name
        return names.get(number, "")

    calls = cost = 0
    caller = callee = ""
    pending = False
    with open(path) as profile:
        for line in profile:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                caller, pending = resolve(line[3:]), False
            elif line.startswith("cfn="):
                callee = resolve(line[4:])
            elif line.startswith("calls="):
                # A call from inside the function itself is part of an outer call's cost.
                pending = target in callee and target not in caller
                if pending:
                    calls += int(line[6:].split()[0])
            elif pending and (line[:1].isdigit() or line[:1] in "+-*"):
                fields = line.split()
                cost += int(fields[1]) if len(fields) > 1 else 0
                pending = False
    return calls, cost


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for target in sys.argv[2:]:
        calls, cost = per_call(sys.argv[1], target)
        each = cost / calls if calls else 0
        print(f"{target}: {calls} calls, {cost} instructions, {each:.0f} per call")


if __name__ == "__main__":
    main()
