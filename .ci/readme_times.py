"""Check the durations the README and docs/running.md state against what this CI run measured.

.ci/run records each step's seconds in .ci/times.txt ("<step> <seconds>"). The README says
how long the tests take on two cores, docs/running.md the smoke run; a statement holds when the
measured time is within [half its low end, 1.5 x its high end] (CI machines differ in load;
a statement off by more than that is false anywhere). Prints every statement beside its
measurement, exits 1 when one does not hold.
"""

import re
import sys
from pathlib import Path

WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
    "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
}  # fmt: skip
# step in .ci/times.txt -> the README phrase that states its duration, in minutes
STATEMENTS = {
    "tests": r"runs the tests \(CPU only, about (?P<low>\w+) minutes? on two cores\)",
    "smoke": r"CI-sized run \(simulated, (?P<low>\d+)(?:-(?P<high>\d+))? min on 2 cores\)",
}


def minutes(word: str) -> float:
    return float(WORDS.get(word, word))


DOCUMENTS = ("README.md", "docs/running.md")  # where the statements stand


def main(times_file: str = ".ci/times.txt", *documents: str) -> int:
    measured = {}
    for line in Path(times_file).read_text().splitlines():
        step, seconds = line.rsplit(" ", 1)
        measured[step] = float(seconds) / 60
    text = " ".join(" ".join(Path(d).read_text().split()) for d in documents or DOCUMENTS)
    failed = False
    for step, pattern in STATEMENTS.items():
        match = re.search(pattern, text)
        if match is None:
            print(
                f"{', '.join(documents or DOCUMENTS)}: no statement of the {step} time ({pattern})"
            )
            failed = True
            continue
        low = minutes(match["low"])
        high = minutes(match["high"]) if match.groupdict().get("high") else low
        took = measured.get(step)
        holds = took is not None and low / 2 <= took <= 1.5 * high
        failed |= not holds
        said = match.group(0)
        print(
            f"{'ok  ' if holds else 'FAIL'} {step}: '{said}', measured "
            + (f"{took:.1f} min" if took is not None else "nothing")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
