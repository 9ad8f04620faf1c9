"""The A/B scripts' option arguments: a kernel module's launch constant (its LAUNCH_OPTIONS)
with the integer values to compare (`--option NAME=v1,v2`) or to hold (`--set NAME=v`).
One parser for every kernel, so each script names a bad argument the same way."""

from types import ModuleType


def _known(flag: str, text: str, name: str, kernel: ModuleType) -> None:
    if name not in kernel.LAUNCH_OPTIONS:
        short = kernel.__name__.rpartition(".")[2]
        raise ValueError(
            f"{flag} {text!r}: {name!r} is not a launch option of {short}; known: "
            f"{', '.join(kernel.LAUNCH_OPTIONS)}"
        )


def values(text: str, kernel: ModuleType) -> tuple[str, list[int]]:
    """'NAME=v1,v2,...' -> (NAME, [v1, v2, ...]): the values to compare, the first the
    baseline of every ratio."""
    name, sep, listed = text.partition("=")
    if not sep or not listed:
        example = f"{kernel.LAUNCH_OPTIONS[0]}=0,1"
        raise ValueError(f"--option {text!r}: expected NAME=v1,v2 (e.g. {example})")
    _known("--option", text, name, kernel)
    try:
        parsed = [int(v) for v in listed.split(",")]
    except ValueError:
        raise ValueError(f"--option {text!r}: values must be integers") from None
    if len(parsed) < 2 or len(set(parsed)) != len(parsed):
        raise ValueError(f"--option {text!r}: give at least two different values")
    return name, parsed


def fixed(text: str, kernel: ModuleType) -> tuple[str, int]:
    """'NAME=v' -> (NAME, v): an option held at one value in every arm."""
    name, _, value = text.partition("=")
    _known("--set", text, name, kernel)
    try:
        return name, int(value)
    except ValueError:
        raise ValueError(f"--set {text!r}: expected NAME=integer") from None
